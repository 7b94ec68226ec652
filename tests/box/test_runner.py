"""Start-up of several models (issue #43): where all fit on the GPU, they are brought in
and never put to sleep (a sleep would leave each a host copy of its weights it never
needs); where not, each model that sleeps, the default included, is brought in and put
away once before the default comes in, so no user's switch pays a first sleep."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.box.test_residency import StandIn
from tests.conftest import make_host
from tests.plan.test_box import fleet_of, two_models
from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload.box.front import FrontDoor
from vllm_offload.box.prepare import PreparedBox
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import ResidencySettings
from vllm_offload.box.runner import warm_up
from vllm_offload.hardware import declared


def started(tmp_path: Path, data: dict[str, Any], gpu_gib: float) -> list[str]:
    """What start-up asked of each engine, for the set ``data`` planned on a card."""
    fleet = fleet_of(data, declared(make_host(None), gpu_mem_gib=gpu_gib, ram_gib=256))
    prepared = PreparedBox(
        plan=fleet,
        model_dirs={},
        specs={},
        runtime_dir=tmp_path,
        api_key=None,
        problems=(),
        notes=(),
    )
    log: list[str] = []
    engines = {name: StandIn(name, log) for name in fleet.models}
    settings = ResidencySettings(
        max_resident=fleet.max_resident, min_resident_s=fleet.min_resident_s
    )
    residency = Residency(engines, settings)
    front = FrontDoor(
        engines=engines, residency=residency, max_model_len={n: 8192 for n in engines}
    )  # type: ignore[arg-type]
    asyncio.run(warm_up(front, prepared, preload=True))
    assert front.ready
    return log


def test_models_that_fit_together_start_and_never_sleep(tmp_path: Path) -> None:
    data = two_models(tmp_path)
    for entry in data["models"]:
        entry["max_model_len"] = 8192
    assert started(tmp_path, data, gpu_gib=80) == ["in chat", "in coder"]


def test_where_not_all_fit_every_model_sleeps_once_before_the_default_comes_in(
    tmp_path: Path,
) -> None:
    """The default too: on the H200 its first put-away, at the first switch, took 6.3 s
    where later ones took 0.5 s (benchmarks/results/h200-vllm-0.33.0/switch/)."""
    assert started(tmp_path, two_models(tmp_path), gpu_gib=24) == [
        "in coder",
        "out coder",
        "in chat",
        "out chat",
        "in chat",
    ]


def test_two_resident_models_that_sleep_when_away_are_not_slept_at_start(
    tmp_path: Path,
) -> None:
    """max_resident = 2 and idle = 'sleep' set by hand (issue #43's run): no sleep at
    start-up, where each sleep left a ~17.6 GiB host copy of the weights."""
    data = two_models(tmp_path, max_resident=2, idle="sleep")
    for entry in data["models"]:
        entry["gpu"] = {"memory_utilization": 0.45}
    assert started(tmp_path, data, gpu_gib=80) == ["in chat", "in coder"]


def test_three_models_two_at_a_time_each_sleeps_once_then_two_come_in(tmp_path: Path) -> None:
    """max_resident 2 of 3: each of them may be put away later, so each sleeps once, the
    default last, two side by side where their shares fit the GPU together (issue #58);
    then the default and the one beside it come in."""
    data = two_models(tmp_path, max_resident=2)
    third = write_shape(tmp_path / "notes", dict(LLAMA3_8B, max_position_embeddings=131072))
    data["models"].append({"path": str(third)})
    for entry in data["models"]:
        entry["gpu"] = {"memory_utilization": 0.4}
    assert started(tmp_path, data, gpu_gib=80) == [
        "in notes",
        "in coder",
        "out notes",
        "out coder",
        "in chat",
        "out chat",
        "in chat",
        "in coder",
    ]


def test_models_with_fixed_pools_start_side_by_side(tmp_path: Path) -> None:
    """Issue #58's set: three 8B models with 8 GiB pools, one on the GPU at a time, on an
    H200: started one after another (321.6 s, ~150 s each). A fixed pool takes its need
    as its share (vLLM checks only that much is free as it starts), so the three start
    side by side, sleep, and the default comes in."""
    data = two_models(tmp_path, max_resident=1)
    third = write_shape(tmp_path / "notes", dict(LLAMA3_8B, max_position_embeddings=131072))
    data["models"].append({"path": str(third)})
    data["gpu"] = {"kv_cache_memory_bytes": 8 << 30}
    assert started(tmp_path, data, gpu_gib=140) == [
        "in notes",
        "in coder",
        "in chat",
        "out notes",
        "out coder",
        "out chat",
        "in chat",
    ]
    # with pools that fill the GPU, one after another, as before
    auto = two_models(tmp_path, max_resident=1)
    assert started(tmp_path, auto, gpu_gib=140) == [
        "in coder",
        "out coder",
        "in chat",
        "out chat",
        "in chat",
    ]


def test_a_serving_engine_that_sleeps_is_shown_holding_its_arena_copy(tmp_path: Path) -> None:
    """Issue #58: `ps` and the page said 8.0 GiB of host RAM for a serving engine whose
    sleep arena kept its weights' copy (~23.6 GiB in all on the H200); the planner's
    fitness check counted it, the per-state figures did not."""
    from vllm_offload.box.runner import planned_memory
    from vllm_offload.plan.box_host import SLEEP_POOLS_BYTES

    fleet = fleet_of(two_models(tmp_path, max_resident=1), big_host_for_test())
    chat = fleet.models["chat"]
    assert chat.idle == "sleep"
    shown = planned_memory(chat)
    copy = chat.plan.weights.gpu_bytes + SLEEP_POOLS_BYTES
    assert shown["host_bytes_serving"] >= copy + chat.plan.cpu_tier.bytes
    assert shown["host_bytes_serving"] == shown["host_bytes_away"]  # the same copy, kept
    stops = fleet_of(two_models(tmp_path, max_resident=1, idle="stop"), big_host_for_test())
    stopped = stops.models["chat"]
    assert planned_memory(stopped)["host_bytes_serving"] < copy + stopped.plan.cpu_tier.bytes
    # residency.host_copy = 'release': the serving engine gives the copy back
    given = fleet_of(two_models(tmp_path, max_resident=1, host_copy="release"), big_host_for_test())
    shown = planned_memory(given.models["chat"])
    assert shown["host_bytes_serving"] == shown["host_bytes_away"] - copy


def big_host_for_test() -> Any:
    return declared(make_host(None), gpu_mem_gib=24, ram_gib=256)
