"""The layered wake's order and its first step's waits (issue #58, vllm_ext/wake_order.py,
vllm_ext/layered_wake.py). CPU-only here: the order from a Llama-shaped model's tensor
names and addresses, and the waits as made on vLLM's dispatcher and attention impls
(events are names, the stream's waits a list). The GPU run (benchmarks/gpu/switch.py
--layered-wake) shows the answers after each switch the same as the first."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from vllm_offload.vllm_ext.wake_order import (
    FIRST,
    CopyGroup,
    attention_layers,
    copy_groups,
    tensor_rank,
    waits,
)


def test_tensors_rank_by_their_layer_the_embedding_first_the_head_last() -> None:
    assert tensor_rank("model.embed_tokens.weight", 31) == FIRST
    assert tensor_rank("model.layers.0.self_attn.qkv_proj.weight", 31) == 0
    assert tensor_rank("model.layers.17.mlp.down_proj.weight", 31) == 17
    assert tensor_rank("model.norm.weight", 31) == 32
    assert tensor_rank("lm_head.weight", 31) == 32
    assert tensor_rank("model.rotary_emb.cos_sin_cache", 31) == FIRST  # unknown: first
    assert tensor_rank("model.layers.3.input_layernorm.weight", 31) == 3


def test_an_allocation_goes_with_the_lowest_layer_it_holds() -> None:
    allocations = [(1000, 100), (0, 100), (2000, 100), (3000, 100), (4000, 100)]
    tensors = [
        ("model.embed_tokens.weight", 0),
        ("model.layers.0.self_attn.qkv_proj.weight", 1000),
        ("model.layers.1.self_attn.qkv_proj.weight", 1050),  # shares layer 0's allocation
        ("model.layers.2.mlp.down_proj.weight", 2000),
        ("model.layers.1.mlp.down_proj.weight", 2060),  # layer 1's tail in layer 2's
        ("model.norm.weight", 3000),
        ("lm_head.weight", 3010),
        ("elsewhere", 9000),  # outside the weight pool
    ]  # the allocation at 4000 holds no known tensor: first
    groups = copy_groups(allocations, tensors, last_layer=2)
    assert groups == [
        CopyGroup(FIRST, (1, 4)),
        CopyGroup(0, (0,)),
        CopyGroup(1, (2,)),
        CopyGroup(3, (3,)),
    ]
    assert sorted(i for g in groups for i in g.allocations) == [0, 1, 2, 3, 4]


def test_each_attention_layer_waits_for_the_piece_after_it() -> None:
    groups = [CopyGroup(FIRST, (0,)), CopyGroup(0, (1,)), CopyGroup(1, (2,))]
    groups += [CopyGroup(2, (3,)), CopyGroup(3, (4,))]  # 3: the final norm and lm_head
    layers = attention_layers(f"model.layers.{n}.self_attn.attn" for n in range(3))
    assert layers is not None
    first, per_layer = waits(groups, layers)
    assert first == 1  # the embedding and layer 0's projections
    assert per_layer == {
        "model.layers.0.self_attn.attn": 2,  # layer 0's MLP, layer 1's projections
        "model.layers.1.self_attn.attn": 3,
        "model.layers.2.self_attn.attn": 4,  # the last: everything
    }
    # a layer with no allocation of its own waits for the last one before it
    first, per_layer = waits([CopyGroup(FIRST, (0,)), CopyGroup(3, (1,))], layers)
    assert first == 0 and per_layer["model.layers.0.self_attn.attn"] == 0


def test_a_model_not_in_layers_n_order_is_not_layered() -> None:
    assert attention_layers(["model.layers.0.attn", "model.layers.0.cross_attn"]) is None
    assert attention_layers(["model.layers.0.attn", "encoder.attn"]) is None
    assert attention_layers([]) is None


class Dispatcher:
    """vLLM's CudagraphDispatcher's dispatch as the model runner calls it (keywords)."""

    def __init__(self, graphs: set[str]) -> None:
        self.graphs, self.asked = graphs, []

    def dispatch(self, num_tokens: int, **kwargs: Any) -> tuple[Any, int]:
        from vllm.config import CUDAGraphMode

        self.asked.append(kwargs.get("invalid_modes"))
        allowed = set(kwargs.get("valid_modes") or {CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE})
        allowed -= set(kwargs.get("invalid_modes") or ())
        for mode in (CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE):
            if mode in allowed and mode.name in self.graphs:
                return mode, num_tokens
        return CUDAGraphMode.NONE, num_tokens


class Impl:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def forward(self, layer: Any, *args: Any, **kwargs: Any) -> str:
        self.log.append(f"attention {self.name}")
        return self.name


@pytest.fixture
def model() -> tuple[Dispatcher, dict[str, Any], list[str]]:
    log: list[str] = []
    attention = {
        f"model.layers.{n}.self_attn.attn": SimpleNamespace(impl=Impl(str(n), log))
        for n in range(3)
    }
    return Dispatcher({"FULL", "PIECEWISE"}), attention, log


def installed(model: tuple[Dispatcher, dict[str, Any], list[str]]) -> Any:
    from vllm_offload.vllm_ext.layered_wake import StepWaits

    dispatcher, attention, log = model
    per_layer = {name: n + 2 for n, name in enumerate(attention)}
    step = StepWaits(["e0", "e1", "e2", "e3", "e4"], 1, per_layer, lambda e: log.append(e))
    step.install(dispatcher, attention)
    return step


def test_the_first_step_runs_piecewise_each_layer_waiting_for_its_next_copies(
    model: tuple[Dispatcher, dict[str, Any], list[str]],
) -> None:
    from vllm.config import CUDAGraphMode

    dispatcher, attention, log = model
    installed(model)
    mode, _ = dispatcher.dispatch(1, uniform_decode=True)  # would replay a full graph
    assert mode == CUDAGraphMode.PIECEWISE and dispatcher.asked == [{CUDAGraphMode.FULL}]
    for layer in attention.values():  # as vLLM's unified_attention_with_output calls it
        layer.impl.forward(layer, "q", "k", "v")
    assert log == ["e1", "attention 0", "e2", "attention 1", "e3", "attention 2", "e4"]
    # done: the next step is vLLM's own, full graph and all, and no more waits
    log.clear()
    assert dispatcher.dispatch(1)[0] == CUDAGraphMode.FULL and dispatcher.asked[-1] is None
    attention["model.layers.0.self_attn.attn"].impl.forward(None)
    assert log == ["attention 0"]


def test_where_only_a_full_graph_may_run_the_step_waits_for_every_copy(
    model: tuple[Dispatcher, dict[str, Any], list[str]],
) -> None:
    from vllm.config import CUDAGraphMode

    dispatcher, _attention, log = model
    installed(model)
    mode, _ = dispatcher.dispatch(1, valid_modes={CUDAGraphMode.FULL})
    assert mode == CUDAGraphMode.FULL and log == ["e4"]  # no Python runs between its layers


def test_a_put_away_before_any_step_takes_the_waits_down(
    model: tuple[Dispatcher, dict[str, Any], list[str]],
) -> None:
    from vllm.config import CUDAGraphMode

    dispatcher, attention, log = model
    installed(model).remove()
    assert dispatcher.dispatch(1)[0] == CUDAGraphMode.FULL
    for layer in attention.values():
        layer.impl.forward(layer)
    assert log == ["attention 0", "attention 1", "attention 2"]
