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
    Layers,
    attention_layers,
    copy_groups,
    tensor_rank,
    waits,
)

LLAMA = Layers("model.", {f"model.layers.{n}.self_attn.attn": n for n in range(32)})


def test_tensors_rank_by_their_layer_the_embedding_first_the_head_last() -> None:
    assert tensor_rank("model.embed_tokens.weight", LLAMA) == FIRST
    assert tensor_rank("model.layers.0.self_attn.qkv_proj.weight", LLAMA) == 0
    assert tensor_rank("model.layers.17.mlp.down_proj.weight", LLAMA) == 17
    assert tensor_rank("model.norm.weight", LLAMA) == 32
    assert tensor_rank("lm_head.weight", LLAMA) == 32
    assert tensor_rank("model.rotary_emb.cos_sin_cache", LLAMA) == FIRST  # unknown: first
    assert tensor_rank("model.layers.3.input_layernorm.weight", LLAMA) == 3
    # another stack's layers (a vision tower's) are not the decoder's: first
    assert tensor_rank("vision_model.encoder.layers.5.mlp.fc1.weight", LLAMA) == FIRST
    assert tensor_rank("vision_model.post_layernorm.norm.weight", LLAMA) == FIRST
    wrapped = attention_layers(["language_model.model.layers.0.self_attn.attn"])
    assert wrapped is not None and wrapped.prefix == "language_model.model."
    assert tensor_rank("language_model.model.layers.0.mlp.up_proj.weight", wrapped) == 0
    assert tensor_rank("language_model.lm_head.weight", wrapped) == 1
    assert tensor_rank("model.layers.0.mlp.up_proj.weight", wrapped) == FIRST


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
    three = Layers("model.", {f"model.layers.{n}.self_attn.attn": n for n in range(3)})
    groups = copy_groups(allocations, tensors, three)
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
    assert attention_layers(["model.layers.0.attn", "vision.layers.1.attn"]) is None
    assert attention_layers([]) is None


class Dispatcher:
    """vLLM's model runner V1 CudagraphDispatcher.dispatch: (mode, batch); FULL where a
    full graph of that size was captured (a one-token decode step here)."""

    def dispatch(self, num_tokens: int, **kwargs: Any) -> tuple[Any, int]:
        from vllm.config import CUDAGraphMode

        full = num_tokens == 1 and kwargs.get("uniform_decode", False)
        return (CUDAGraphMode.FULL if full else CUDAGraphMode.PIECEWISE), num_tokens


class Manager:
    """Model runner V2's ModelCudaGraphManager.dispatch: a batch with its cg_mode."""

    def dispatch(self, num_reqs: int, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        from vllm.config import CUDAGraphMode

        full = num_tokens == num_reqs
        return SimpleNamespace(cg_mode=CUDAGraphMode.FULL if full else CUDAGraphMode.PIECEWISE)


class Impl:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def forward(self, layer: Any, *args: Any, **kwargs: Any) -> str:
        self.log.append(f"attention {self.name}")
        return self.name


def model(dispatcher: Any) -> tuple[Any, dict[str, Any], list[str], Any]:
    """Three attention layers, their waits installed on ``dispatcher``."""
    from vllm_offload.vllm_ext.layered_wake import StepWaits

    log: list[str] = []
    attention = {
        f"model.layers.{n}.self_attn.attn": SimpleNamespace(impl=Impl(str(n), log))
        for n in range(3)
    }
    per_layer = {name: n + 2 for n, name in enumerate(attention)}
    step = StepWaits(["e0", "e1", "e2", "e3", "e4"], 1, per_layer, log.append)
    step.install(dispatcher, attention)
    return dispatcher, attention, log, step


def forward(attention: dict[str, Any]) -> None:
    for layer in attention.values():  # as vLLM's unified_attention_with_output calls it
        layer.impl.forward(layer, "q", "k", "v")


def test_the_first_step_waits_layer_by_layer_then_the_waits_go() -> None:
    dispatcher, attention, log, _ = model(Dispatcher())
    dispatcher.dispatch(64, uniform_decode=False)  # a prefill: piecewise graphs
    forward(attention)
    assert log == ["e1", "attention 0", "e2", "attention 1", "e3", "attention 2", "e4"]
    log.clear()  # done: the next steps are vLLM's own
    dispatcher.dispatch(64)
    forward(attention)
    assert log == ["attention 0", "attention 1", "attention 2"]


@pytest.mark.parametrize("runner", ["V1", "V2"])
def test_a_full_graph_first_waits_for_every_copy_before_it(runner: str) -> None:
    dispatcher, attention, log, _ = model(Dispatcher() if runner == "V1" else Manager())
    if runner == "V1":
        dispatcher.dispatch(1, uniform_decode=True)
    else:
        dispatcher.dispatch(1, 1, 1, 0)
    assert log == ["e4"]  # no Python runs between a full graph's layers
    forward(attention)  # the waits are down: all was waited for
    assert log == ["e4", "attention 0", "attention 1", "attention 2"]


def test_model_runner_v2s_piecewise_step_waits_layer_by_layer() -> None:
    dispatcher, attention, log, _ = model(Manager())
    dispatcher.dispatch(1, 64, None, 0)
    forward(attention)
    assert log == ["e1", "attention 0", "e2", "attention 1", "e3", "attention 2", "e4"]


def test_a_put_away_before_any_step_takes_the_waits_down() -> None:
    dispatcher, attention, log, step = model(Dispatcher())
    step.remove()
    dispatcher.dispatch(64)
    forward(attention)
    assert log == ["attention 0", "attention 1", "attention 2"]


def decoder_of(context: dict[str, Any], **model: Any) -> Any:
    """LayeredWakeWorker._decoder for a vLLM config made of ``context`` (its
    static_forward_context) and ``model`` (model_config's fields), on a worker not started."""
    from vllm_offload.vllm_ext.layered_wake import LayeredWakeWorker

    worker = LayeredWakeWorker.__new__(LayeredWakeWorker)
    worker.vllm_config = SimpleNamespace(  # type: ignore[assignment]
        compilation_config=SimpleNamespace(static_forward_context=context),
        speculative_config=model.pop("speculative", None),
        parallel_config=SimpleNamespace(use_ubatching=False),
        model_config=SimpleNamespace(
            **{"is_multimodal_model": False, "is_encoder_decoder": False, "quantization": None}
            | model
        ),
    )
    worker.model_runner = SimpleNamespace(cudagraph_manager=object())  # type: ignore[assignment]
    return worker._decoder


def test_an_engine_wakes_layer_by_layer_only_where_it_knows_the_order() -> None:
    from vllm.model_executor.layers.attention.attention import Attention

    llama = {f"model.layers.{n}.self_attn.attn": Attention.__new__(Attention) for n in range(2)}
    attention, layers = decoder_of(llama)
    assert attention == llama and layers.prefix == "model." and layers.last == 1
    assert decoder_of(llama, speculative=object()) is None
    assert decoder_of(llama, quantization="fp8") is None
    assert decoder_of(llama, is_multimodal_model=True) is None
    assert decoder_of(llama | {"model.layers.2.mamba": SimpleNamespace(impl=None)}) is None
