"""Deep sleep in the plan (issue #58): models asleep keep no GPU memory, so the model on the
GPU gets it, and their host RAM counts what the driver's checkpoint holds; refused where
this host's driver cannot checkpoint a process, said and ignored where no model sleeps."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.plan.test_box import fleet_of
from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload.box.runner import planned_memory
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.plan.box import BoxPlan
from vllm_offload.plan.box_host import ASLEEP_GPU_BYTES
from vllm_offload.plan.box_render import box_json, render_box
from vllm_offload.plan.records import PlanError


def three_models(tmp_path: Path, **residency: Any) -> dict[str, Any]:
    paths = [write_shape(tmp_path / n, LLAMA3_8B) for n in ("chat", "coder", "writer")]
    return {"models": [{"path": str(p)} for p in paths], "residency": residency}


def card(gib: float = 24) -> HostFacts:
    """A card whose driver NVML read (as on the box itself), and can checkpoint."""
    return replace(make_host(gib, ram_gib=128), gpu_source="nvml", process_checkpoint=True)


def test_models_asleep_leave_the_gpu_to_the_one_on_it(tmp_path: Path) -> None:
    kept = fleet_of(three_models(tmp_path, max_resident=1), card(40))
    deep = fleet_of(three_models(tmp_path, max_resident=1, deep_sleep=True), card(40))
    assert deep.deep_sleep and not kept.deep_sleep
    for name, model in deep.models.items():
        before = kept.models[name]
        # two models asleep beside each: 6 GiB of the card left to them without deep sleep
        share = before.config.gpu.memory_utilization + 2 * ASLEEP_GPU_BYTES / (40 * GIB)
        assert model.config.gpu.memory_utilization == pytest.approx(share, abs=1e-3)
        assert model.plan.gpu.budget_bytes > before.plan.gpu.budget_bytes + 5 * GIB
        assert model.away_gpu_bytes == 0 and before.away_gpu_bytes == ASLEEP_GPU_BYTES
        assert model.serving_ram_bytes - model.plan.cpu_tier.bytes == (
            before.serving_ram_bytes - before.plan.cpu_tier.bytes
        )
        away = model.away_ram_bytes - model.plan.cpu_tier.bytes
        assert away == before.away_ram_bytes - before.plan.cpu_tier.bytes + ASLEEP_GPU_BYTES
        assert planned_memory(model)["gpu_bytes_away"] == 0
        assert planned_memory(before)["gpu_bytes_away"] == ASLEEP_GPU_BYTES
    assert deep.notes.problems == ()
    assert any(d.startswith("residency.deep_sleep: a model asleep") for d in deep.notes.decisions)
    assert "asleep when away (checkpointed off the GPU)" in render_box(deep)
    assert box_json(deep)["deep_sleep"] is True


def test_three_8b_models_fit_a_24gb_card_in_deep_sleep_alone(tmp_path: Path) -> None:
    """Beside two models asleep (3 GiB each) an 8B model's weights no longer fit the card."""
    with pytest.raises(PlanError, match=r"do not fit in 65% of 24\.0 GiB"):
        fleet_of(three_models(tmp_path, max_resident=1), card())
    fleet = fleet_of(three_models(tmp_path, max_resident=1, deep_sleep=True), card())
    assert fleet.notes.problems == ()
    assert all(m.config.gpu.memory_utilization == 0.9 for m in fleet.models.values())


def test_a_driver_that_cannot_checkpoint_refuses_it(tmp_path: Path) -> None:
    host = replace(card(), process_checkpoint=False)
    fleet = fleet_of(three_models(tmp_path, max_resident=1, deep_sleep=True), host)
    (problem,) = fleet.notes.problems
    assert problem["field"] == "residency.deep_sleep"
    assert "cuCheckpointProcessLock" in problem["message"] and "driver 570" in problem["message"]
    assert not fleet.deep_sleep


def test_a_declared_gpu_is_planned_as_the_box_will_run_it(tmp_path: Path) -> None:
    """`plan --gpu-mem-gib` on another machine: the box's driver is taken to checkpoint."""
    fleet = fleet_of(three_models(tmp_path, max_resident=1, deep_sleep=True), make_host(24))
    assert fleet.deep_sleep and fleet.notes.problems == ()


def test_where_no_model_sleeps_it_is_said_and_ignored(tmp_path: Path) -> None:
    data = three_models(tmp_path, max_resident=1, deep_sleep=True, idle="stop")
    fleet = fleet_of(data, card())
    assert not fleet.deep_sleep and fleet.notes.problems == ()
    assert any("nothing to move" in d for d in fleet.notes.decisions)


def test_two_resident_share_what_the_one_asleep_kept(tmp_path: Path) -> None:
    """max_resident 'auto': three 8B models on a 48 GB card, two on it beside one asleep;
    in deep sleep the two get the 3 GiB the third kept."""
    data = three_models(tmp_path)
    for entry in data["models"]:
        entry["max_model_len"] = 8192
    kept = fleet_of(data, card(48))
    deep = fleet_of({**data, "residency": {"deep_sleep": True}}, card(48))
    assert kept.max_resident == deep.max_resident == 2
    assert deep.notes.problems == ()

    def two(fleet: BoxPlan) -> float:
        shares = sorted(m.config.gpu.memory_utilization for m in fleet.models.values())
        return sum(shares[-2:])

    assert two(kept) + ASLEEP_GPU_BYTES / (48 * GIB) <= 0.9
    assert two(deep) > two(kept) + 0.9 * ASLEEP_GPU_BYTES / (48 * GIB)


def test_a_model_split_over_gpus_refuses_it(tmp_path: Path) -> None:
    """Tensor-parallel engines share GPU memory between their processes (CUDA IPC), which
    the driver's process checkpoint does not support."""
    big = write_shape(tmp_path / "big", dict(LLAMA3_8B, num_hidden_layers=80))
    small = write_shape(tmp_path / "small", LLAMA3_8B)
    data = {
        "models": [{"path": str(big), "gpus": [0, 1]}, {"path": str(small), "gpus": [0]}],
        "residency": {"max_resident": 1, "deep_sleep": True},
    }
    two_cards = replace(
        make_host(None, ram_gib=512),
        gpus=(*card(80).gpus, replace(card(80).gpus[0], index=1)),
        gpu_source="nvml",
        process_checkpoint=True,
    )
    fleet = fleet_of(data, two_cards)
    (problem,) = fleet.notes.problems
    assert problem["field"] == "residency.deep_sleep"
    assert "'big' is split over several GPUs" in problem["message"]


def test_turns_where_each_switch_checkpoints(tmp_path: Path) -> None:
    kept = fleet_of(three_models(tmp_path, max_resident=1), card(40))
    deep = fleet_of(three_models(tmp_path, max_resident=1, deep_sleep=True), card(40))
    assert kept.min_resident_s == 0 and deep.min_resident_s == 5
    assert any("auto -> 5: deep sleep" in d for d in deep.notes.decisions)


def test_shares_set_by_hand_fit_beside_models_in_deep_sleep(tmp_path: Path) -> None:
    """max_resident 2 with shares of 0.47 each: beside a model asleep (3 GiB of 48) the two
    would take over the card; checkpointed, it takes none of it."""
    data = three_models(tmp_path, max_resident=2, deep_sleep=True)
    for entry in data["models"]:
        entry.update(max_model_len=8192, gpu={"memory_utilization": 0.47})
    deep = fleet_of(data, card(48))
    assert deep.notes.problems == ()
    assert {m.config.gpu.memory_utilization for m in deep.models.values()} == {0.47}
