"""Several models on several GPUs (issue #59): which GPU each engine runs on, read from NVML
(a fake driver with 1-4 GPUs of mixed sizes), placed by the planner or pinned by hand, each
group of models that share GPUs planned on its GPUs alone."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.fake_nvml import A6000, H100, RTX_4090, FakeNvml
from tests.plan.test_box import fleet_of
from tests.shapes import LLAMA3_8B, LLAMA_70B, write_shape
from vllm_offload import hardware
from vllm_offload.config import parse
from vllm_offload.hardware import GIB, GpuFacts, HostFacts
from vllm_offload.plan.box import BoxPlan
from vllm_offload.plan.box_render import box_json
from vllm_offload.plan.placement import Placed, place, splits_for
from vllm_offload.plan.records import PlanError

# Qwen2.5-14B's width at Llama's heads (a ~28 GiB model)
MID_14B = dict(
    LLAMA3_8B,
    hidden_size=5120,
    intermediate_size=13824,
    num_hidden_layers=48,
    num_attention_heads=40,
    num_key_value_heads=8,
)


@pytest.fixture(autouse=True)
def every_gpu_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def nvml_host(monkeypatch: pytest.MonkeyPatch, *gpus: tuple[str, int, int]) -> HostFacts:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus))
    return replace(make_host(None, ram_gib=512, shm_gib=256), gpus=hardware.probe_gpus())


def box(
    tmp_path: Path,
    host: HostFacts,
    shapes: dict[str, dict[str, Any]],
    shared: dict[str, Any] | None = None,
    **more: Any,
) -> BoxPlan:
    """The set of ``shapes`` (by served name; ``more``: each one's entry keys) planned on
    ``host``; ``shared``: the file's tables beside [[models]]."""
    entries = []
    for name, shape in shapes.items():
        entry = {"path": str(write_shape(tmp_path / name, shape)), "served_name": name}
        entries.append(entry | more.get(name, {}))
    return fleet_of({"models": entries, **(shared or {})}, host)


def gpus_of(plan: BoxPlan) -> dict[str, tuple[int, ...]]:
    return {name: model.gpus for name, model in plan.models.items()}


def placement_lines(plan: BoxPlan) -> list[str]:
    return [d for d in plan.notes.decisions if d.startswith("placement:")]


def test_one_gpu_places_nothing_and_says_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = nvml_host(monkeypatch, H100)
    plan = box(tmp_path, host, {"a": LLAMA3_8B, "b": LLAMA3_8B})
    assert gpus_of(plan) == {"a": (0,), "b": (0,)}
    assert placement_lines(plan) == []
    assert plan.max_resident == 2  # two 8B models fit an H100 together, as before


def test_two_cards_three_models_two_serve_apart_and_the_third_shares_gpu_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's example: 2x RTX 4090, three 8B models: no switching between the first
    two; the third shares GPU 0 and switches with its neighbour alone."""
    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    plan = box(tmp_path, host, {"chat": LLAMA3_8B, "coder": LLAMA3_8B, "third": LLAMA3_8B})
    assert gpus_of(plan) == {"chat": (0,), "coder": (1,), "third": (0,)}
    models = plan.models
    assert [models[n].resident_beside for n in ("chat", "coder", "third")] == [1, 1, 1]
    # coder has GPU 1 to itself: nothing asleep beside it takes a share of it
    assert models["coder"].config.gpu.memory_utilization == 0.9
    assert models["chat"].config.gpu.memory_utilization < 0.9  # 'third' asleep beside it
    assert all(m.plan.tensor_parallel_size == 1 for m in models.values())
    lines = placement_lines(plan)
    assert "a GPU of its own" in lines[0] and "a GPU of its own" in lines[1]
    assert lines[2].endswith("beside 'chat' (no GPU it fits is free)")
    # 'coder' never switches: it stops if put away by hand, and keeps no sleep copy
    assert [models[n].idle for n in ("chat", "coder", "third")] == ["sleep", "stop", "sleep"]
    assert models["coder"].away_ram_bytes == 0 and not models["coder"].switches
    assert models["chat"].switches and models["third"].switches
    assert box_json(plan)["models"]["coder"]["gpus"] == [1]  # type: ignore[index]


def test_the_larger_model_takes_the_card_only_it_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Largest first: a ~28 GiB model listed second goes to the 48 GiB card, the 8B model
    to the 24 GiB one (file order would have put the 8B on the roomier card)."""
    host = nvml_host(monkeypatch, RTX_4090, A6000)
    plan = box(tmp_path, host, {"small": LLAMA3_8B, "mid": MID_14B})
    assert gpus_of(plan) == {"small": (0,), "mid": (1,)}
    assert plan.models["mid"].plan.tensor_parallel_size == 1


def test_a_model_no_card_holds_is_split_by_tensor_parallelism(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 70B model (131 GiB) on two H100s: tensor parallel 2 (the issue's new user had it
    planned as one GPU holding 131 GiB); on three, an 8B model beside it takes the third."""
    plan = box(tmp_path, nvml_host(monkeypatch, H100, H100), {"big": LLAMA_70B})
    assert gpus_of(plan) == {"big": (0, 1)}
    big = plan.models["big"].plan
    assert big.tensor_parallel_size == 2 and big.weights.offloaded_bytes == 0
    assert "split over 2 (tensor parallel 2" in placement_lines(plan)[0]
    three = box(
        tmp_path, nvml_host(monkeypatch, H100, H100, H100), {"big": LLAMA_70B, "small": LLAMA3_8B}
    )
    assert gpus_of(three) == {"big": (0, 1), "small": (2,)}
    assert all(m.resident_beside == 1 for m in three.models.values())


def test_four_mixed_cards_each_model_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = nvml_host(monkeypatch, RTX_4090, A6000, RTX_4090, H100)
    shapes = {"a": LLAMA3_8B, "b": MID_14B, "c": LLAMA3_8B, "d": MID_14B}
    plan = box(tmp_path, host, shapes)
    placed = gpus_of(plan)
    assert sorted(placed.values()) == [(0,), (1,), (2,), (3,)]
    assert {placed["b"], placed["d"]} == {(1,), (3,)}  # the 28 GiB ones on the big cards
    assert all(m.resident_beside == 1 for m in plan.models.values())
    assert not any("min_resident_s" in d for d in plan.notes.decisions)  # nothing switches


def test_gpus_pin_a_model_and_a_pin_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    shapes = {"a": LLAMA3_8B, "b": LLAMA3_8B}
    plan = box(tmp_path, host, shapes, a={"gpus": [1]})
    assert gpus_of(plan) == {"a": (1,), "b": (0,)}
    assert placement_lines(plan)[0] == "placement: 'a' on GPU 1 (models[].gpus)"
    with pytest.raises(PlanError) as missing:
        box(tmp_path, host, shapes, b={"gpus": [2]})
    assert missing.value.field == "models[1].gpus" and "GPU 2 is not here" in missing.value.message
    with pytest.raises(PlanError) as uneven:
        box(tmp_path, nvml_host(monkeypatch, H100, H100, H100), shapes, a={"gpus": [0, 1, 2]})
    assert uneven.value.field == "models[0].gpus" and "over 3 GPUs" in uneven.value.message


def test_place_largest_first_to_the_roomiest() -> None:
    """The rule alone, on needs in GiB: an empty card first, then the one with most room."""
    cards = [
        GpuFacts(index=i, name="g", total_bytes=int(size * GIB), free_bytes=0)
        for i, size in enumerate((40, 40, 100))
    ]

    def model(need_gib: float) -> Placed:
        return Placed(need_on=lambda k: int(need_gib * GIB / k), splits=(1, 2), utilization=1.0)

    placed = place({"s": model(10), "m": model(30), "l": model(90), "x": model(20)}, cards)
    # l only fits GPU 2; m takes an empty card (0); x the other empty one (1); s then the
    # roomiest: GPU 1 (20 left) before GPU 0 and GPU 2 (10 each)
    assert placed.gpus == {"s": (1,), "m": (0,), "l": (2,), "x": (1,)}
    two = place({"h": model(70)}, [*cards[:2], replace(cards[2], total_bytes=30 * GIB)])
    assert two.gpus == {"h": (0, 1)}  # 35 a card over the two 40s
    none = place({"h": model(150)}, cards)  # 75 a card fits GPU 2 alone: no pair holds it
    assert none.gpus == {"h": (2,)} and "fits no GPU" in none.notes.decisions[0]
    assert splits_for(32, 8, 4) == (1, 2, 4)
    assert splits_for(40, 8, 4) == (1, 2, 4)
    assert splits_for(64, 8, 3) == (1, 2)


def test_plan_and_each_engine_name_their_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`plan` says each GPU's models and size and each model's GPUs; each engine's launch
    sees only its own GPUs, numbered as NVML (and nvidia-smi) number them. On one GPU
    neither: the engines see what the server sees."""
    from vllm_offload.box.prepare import prepare_box
    from vllm_offload.plan.box_render import render_box

    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    shapes = {"chat": LLAMA3_8B, "coder": LLAMA3_8B, "third": LLAMA3_8B}
    plan = box(tmp_path, host, shapes)
    shown = render_box(plan)
    assert "GPU 0 (NVIDIA GeForce RTX 4090, 23.67 GiB): 'chat', 'third' (1 at a time)" in shown
    assert "GPU 1 (NVIDIA GeForce RTX 4090, 23.67 GiB): 'coder'\n" in shown
    (header,) = [line for line in shown.splitlines() if line.startswith("== model 'coder'")]
    assert header.endswith(", on GPU 1)")
    data = {
        "models": [
            {"path": str(tmp_path / n), "served_name": n, "max_model_len": 4096} for n in shapes
        ]
    }
    prepared = prepare_box(parse(data), host, {}, None)
    envs = {n: spec.env for n, spec in prepared.specs.items()}
    assert [envs[n].get("CUDA_VISIBLE_DEVICES") for n in shapes] == ["0", "1", "0"]
    assert {envs[n]["CUDA_DEVICE_ORDER"] for n in shapes} == {"PCI_BUS_ID"}
    one = prepare_box(parse(data), nvml_host(monkeypatch, H100), {}, None)
    assert not any("CUDA_VISIBLE_DEVICES" in spec.env for spec in one.specs.values())


def test_cuda_visible_devices_limits_the_gpus_planned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server started with CUDA_VISIBLE_DEVICES=1,2 plans on those two (NVML lists all
    four), keeping their numbers; names it cannot map (UUIDs) leave all four."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    gpus = nvml_host(monkeypatch, H100, A6000, RTX_4090, H100).gpus
    assert [(g.index, g.name) for g in gpus] == [(1, A6000[0]), (2, RTX_4090[0])]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5a1e0b2c")
    assert len(nvml_host(monkeypatch, H100, A6000, RTX_4090, H100).gpus) == 4


def test_a_model_alone_on_its_gpu_may_have_a_host_extension_beside_models_that_sleep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of #59: the box's idle was one for all, so 'coder' alone on GPU 1 was to
    sleep, and its host extension was refused ('cannot sleep')."""
    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    shapes = {"chat": LLAMA3_8B, "coder": LLAMA3_8B, "third": LLAMA3_8B}
    plan = box(tmp_path, host, shapes, coder={"kv_offload": {"host_extension_gib": 8}})
    assert plan.notes.problems == ()
    assert all(m.plan.notes.problems == () for m in plan.models.values())
    assert plan.models["coder"].plan.extension.bytes == 8 * GIB


def test_parallel_asked_for_is_placed_as_asked_or_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[parallel] sets how many GPUs each model takes: a pipeline split goes on two GPUs
    (its tensor split left as it is), a pin of another count is refused, and so is a split
    over more GPUs than the box has."""
    two = nvml_host(monkeypatch, H100, H100)
    shapes = {"a": LLAMA3_8B, "b": LLAMA3_8B}

    def boxed(host: HostFacts, parallel: dict[str, int], **more: Any) -> BoxPlan:
        return box(tmp_path, host, shapes, {"parallel": parallel}, **more)

    piped = boxed(two, {"pipeline_parallel_size": 2})
    assert gpus_of(piped) == {"a": (0, 1), "b": (0, 1)}
    assert {m.plan.tensor_parallel_size for m in piped.models.values()} == {1}
    with pytest.raises(PlanError) as short:
        boxed(two, {"tensor_parallel_size": 2}, a={"gpus": [0]})
    assert short.value.field == "models[0].gpus" and "asks for 2 GPUs" in short.value.message
    with pytest.raises(PlanError) as wide:
        boxed(nvml_host(monkeypatch, H100, H100, H100), {"tensor_parallel_size": 4})
    assert wide.value.field == "parallel.tensor_parallel_size" and "has 3" in wide.value.message


def test_every_pin_is_checked_on_any_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pin to a GPU that is not there is refused on a one-GPU box and on a CPU host too,
    and a missing GPU is named before the heads' split; one model alone takes no pin."""
    from vllm_offload.box.prepare import single
    from vllm_offload.config import ConfigError

    shapes = {"a": LLAMA3_8B, "b": LLAMA3_8B}
    for host in (nvml_host(monkeypatch, H100), make_host(None)):
        with pytest.raises(PlanError) as missing:
            box(tmp_path, host, shapes, b={"gpus": [1]})
        assert missing.value.field == "models[1].gpus" and "GPU 1 is not here" in str(missing.value)
    three = nvml_host(monkeypatch, H100, H100, H100)
    with pytest.raises(PlanError) as four:
        box(tmp_path, three, shapes, a={"gpus": [0, 1, 2, 3]})
    assert "GPU 3 is not here" in four.value.message
    lone = parse({"models": [{"path": str(tmp_path / "a"), "gpus": [0]}]})
    with pytest.raises(ConfigError) as alone:
        single(lone)
    assert alone.value.field == "models[0].gpus" and "CUDA_VISIBLE_DEVICES" in alone.value.message


def test_gpus_named_by_uuid_are_not_placed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review of #59: with CUDA_VISIBLE_DEVICES naming GPUs by UUID (or MIG instance) NVML
    still lists every GPU, and NVML indexes in each engine's environment would have widened
    the restriction: nothing is placed, and the engines keep the server's environment."""
    from vllm_offload.box.prepare import prepare_box

    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    for n in ("a", "b"):
        write_shape(tmp_path / n, LLAMA3_8B)
    data = {"models": [{"path": str(tmp_path / n), "max_model_len": 4096} for n in ("a", "b")]}
    env = {"CUDA_VISIBLE_DEVICES": "GPU-5a1e0b2c"}
    prepared = prepare_box(parse(data), host, env, None)
    assert {m.gpus for m in prepared.plan.models.values()} == {()}
    assert any(
        "CUDA_VISIBLE_DEVICES names GPUs by UUID" in d for d in prepared.plan.notes.decisions
    )
    assert not any("CUDA_VISIBLE_DEVICES" in spec.env for spec in prepared.specs.values())


def test_a_refusal_on_several_gpus_names_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = nvml_host(monkeypatch, RTX_4090, RTX_4090)
    shapes = {"a": LLAMA3_8B, "b": LLAMA3_8B}
    with pytest.raises(PlanError) as refused:
        box(tmp_path, host, shapes, b={"gpu": {"kv_cache_memory_bytes": 64 * GIB}})
    assert refused.value.field.startswith("models[1].") and "'b':" in refused.value.message
