"""Weights kept on the GPU asleep in the plan (residency.asleep_weights_on_gpu_gib, issue #58:
a switch is the weights' copy): each model asleep keeps up to that much of its weights on
the GPU, so the model on the GPU gets that much less of it per model asleep beside it, the
host copy is that much smaller, the engine is told the bytes, and start-up's later batches
start beside what the earlier ones keep; refused with deep sleep and at level 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.plan.test_box import fleet_of
from tests.plan.test_deep_sleep_plan import card, three_models
from vllm_offload.box.runner import planned_memory
from vllm_offload.hardware import GIB
from vllm_offload.plan.box_host import ASLEEP_GPU_BYTES
from vllm_offload.plan.box_render import box_json, render_box
from vllm_offload.plan.box_start import start_batches
from vllm_offload.vllm_ext.knobs import SLEEP_WEIGHTS_ON_GPU_ENV


def test_models_asleep_keep_their_last_weights_on_the_gpu(tmp_path: Path) -> None:
    none = fleet_of(three_models(tmp_path, max_resident=1), card(80))
    kept = fleet_of(three_models(tmp_path, max_resident=1, asleep_weights_on_gpu_gib=6), card(80))
    assert kept.notes.problems == ()
    assert any("keeps up to 6.00 GiB of its weights" in d for d in kept.notes.decisions)
    assert "and up to 6.00 GiB of its weights on the GPU" in render_box(kept)
    assert box_json(kept)["models"]["chat"]["weights_on_gpu_bytes"] == 6 * GIB  # type: ignore[index]
    for name, model in kept.models.items():
        before = none.models[name]
        assert model.weights_on_gpu_bytes == 6 * GIB and before.weights_on_gpu_bytes == 0
        assert model.away_gpu_bytes == ASLEEP_GPU_BYTES + 6 * GIB
        assert planned_memory(model)["gpu_bytes_away"] == ASLEEP_GPU_BYTES + 6 * GIB
        # two models asleep beside each, 6 GiB more each on the card
        share = before.config.gpu.memory_utilization - 2 * 6 * GIB / (80 * GIB)
        assert model.config.gpu.memory_utilization == pytest.approx(share, abs=1e-3)
        # the host copy less what stays, less one allocation (the engine keeps whole
        # ones: the largest, the embedding's 128,256 x 4,096 x 2 bytes, may not stay)
        embedding = 128_256 * 4_096 * 2
        for held in ("away_ram_bytes", "serving_ram_bytes"):  # besides the CPU tiers
            less = getattr(before, held) - before.plan.cpu_tier.bytes
            assert less - (getattr(model, held) - model.plan.cpu_tier.bytes) == (
                6 * GIB - embedding
            ), held


def test_no_more_than_a_model_s_weights_stay(tmp_path: Path) -> None:
    fleet = fleet_of(
        three_models(tmp_path, max_resident=1, asleep_weights_on_gpu_gib=100), card(141)
    )
    assert fleet.notes.problems == ()  # each asleep beside it counted as its weights, not 100
    for model in fleet.models.values():
        assert model.weights_on_gpu_bytes == model.plan.weights.gpu_bytes
        assert model.away_gpu_bytes == ASLEEP_GPU_BYTES + model.plan.weights.gpu_bytes


@pytest.mark.parametrize(
    ("residency", "fix"),
    [
        ({"deep_sleep": True}, "residency.deep_sleep = false"),
        ({"sleep_level": 2}, "residency.sleep_level = 1"),
    ],
)
def test_it_is_refused_where_the_weights_leave_the_gpu_anyway(
    tmp_path: Path, residency: dict[str, object], fix: str
) -> None:
    data = three_models(tmp_path, max_resident=1, asleep_weights_on_gpu_gib=6, **residency)
    fleet = fleet_of(data, card(80))
    (problem,) = fleet.notes.problems
    assert problem["field"] == "residency.asleep_weights_on_gpu_gib" and fix in problem["message"]
    assert all(m.weights_on_gpu_bytes == 0 for m in fleet.models.values())


def test_the_engine_is_told_the_bytes_planned(tmp_path: Path) -> None:
    from vllm_offload import launch
    from vllm_offload.launch_spec import EngineLaunch

    fleet = fleet_of(three_models(tmp_path, max_resident=1, asleep_weights_on_gpu_gib=6), card(80))
    model = next(iter(fleet.models.values()))
    engine = EngineLaunch(socket="/tmp/s", sleeps=True, weights_on_gpu=model.weights_on_gpu_bytes)
    spec = launch.build(model.config, model.plan, tmp_path, engine=engine)
    assert spec.env[SLEEP_WEIGHTS_ON_GPU_ENV] == str(6 * GIB)
    plain = launch.build(
        model.config, model.plan, tmp_path, engine=EngineLaunch(socket="/tmp/s", sleeps=True)
    )
    assert SLEEP_WEIGHTS_ON_GPU_ENV not in plain.env


def test_later_batches_start_beside_what_the_earlier_ones_keep_asleep() -> None:
    """Two engines of 30 GiB start side by side on 72 GiB; the third, after them, would
    fit the card alone but not beside the 2 x 20 GiB they keep asleep."""
    cards = card(80).gpus
    budgets = dict.fromkeys("abc", 30 * GIB)
    little = start_batches("abc", budgets, {}, cards, 0.9, dict.fromkeys("abc", 3 * GIB))
    assert little == (("a", "b"), ("c",))
    lots = start_batches(
        "abcd", {**budgets, "d": 30 * GIB}, {}, cards, 0.9, dict.fromkeys("abcd", 20 * GIB)
    )
    assert lots == (("a", "b"), ("c",), ("d",))


def test_start_up_is_planned_beside_what_models_asleep_keep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload.plan import box

    seen: list[dict[str, int]] = []

    def batches(*args: object) -> tuple[tuple[str, ...], ...]:
        seen.append(args[-1])  # type: ignore[arg-type]
        return ()

    monkeypatch.setattr(box, "start_batches", batches)
    fleet = fleet_of(three_models(tmp_path, max_resident=1, asleep_weights_on_gpu_gib=6), card(80))
    assert seen == [{n: m.away_gpu_bytes for n, m in fleet.models.items()}]
    assert set(seen[0].values()) == {ASLEEP_GPU_BYTES + 6 * GIB}
