"""Several models on one box (issue #31): each model planned as it runs when on the GPU,
beside the others asleep; the set's host RAM; what cannot fit, refused naming the model
and the number. Expected numbers are worked out here from the planner's constants."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.shapes import LLAMA3_8B, QWEN25_7B, write_shape
from vllm_offload.config import parse
from vllm_offload.config.schema import engine_configs
from vllm_offload.hardware import GIB, HostFacts, declared
from vllm_offload.model import facts as model_facts
from vllm_offload.plan.box import BoxPlan, plan_box
from vllm_offload.plan.box_host import ASLEEP_GPU_BYTES, SLEEP_POOLS_BYTES
from vllm_offload.plan.box_render import box_json
from vllm_offload.plan.host import SERVER_SHM_BYTES, ram_reserve, server_ram_bytes
from vllm_offload.plan.records import BoxInputs, PlanError
from vllm_offload.plan.together import gpu_need
from vllm_offload.upstream.version import PINNED


def two_models(tmp_path: Path, **residency: Any) -> dict[str, Any]:
    chat = write_shape(tmp_path / "chat", dict(LLAMA3_8B, max_position_embeddings=131072))
    coder = write_shape(tmp_path / "coder", dict(LLAMA3_8B, max_position_embeddings=131072))
    return {"models": [{"path": str(chat)}, {"path": str(coder)}], "residency": residency}


def fleet_of(data: dict[str, Any], host: HostFacts, platform: str = "cuda") -> BoxPlan:
    config = parse(data)
    engines = engine_configs(config)
    facts = {n: model_facts.read(Path(c.model.path)) for n, c in engines.items()}
    return plan_box(
        BoxInputs(
            config=config,
            engines=engines,
            facts=facts,
            disks={n: None for n in engines},
            host=host,
            platform=platform,  # type: ignore[arg-type]
            vllm_release=PINNED[platform],
            env={},
        )
    )


def big_host() -> HostFacts:
    return declared(make_host(None), gpu_mem_gib=80, ram_gib=256)


def test_two_models_asleep_beside_each_other(tmp_path: Path) -> None:
    fleet = fleet_of(two_models(tmp_path, max_resident=1), big_host())
    assert list(fleet.models) == ["chat", "coder"] and fleet.default == "chat"
    assert {m.idle for m in fleet.models.values()} == {"sleep"}
    # the GPU less the other model asleep
    share = 0.9 - ASLEEP_GPU_BYTES / (80 * GIB)
    for model in fleet.models.values():
        assert model.config.gpu.memory_utilization == pytest.approx(share, abs=1e-4)
        assert model.plan.gpu.budget_bytes == int(80 * GIB * round(share, 4))
    # host RAM: each engine's own processes and its slept weights, then equal tiers
    plan = fleet.models["chat"].plan
    holds = server_ram_bytes(1, "cuda") + plan.weights.gpu_bytes + SLEEP_POOLS_BYTES
    host = big_host()
    ram = host.ram_available_bytes - ram_reserve(host, "cuda") - 2 * holds
    shm = host.shm_free_bytes - 2 * SERVER_SHM_BYTES
    tier = min(ram, shm) // 2 // GIB * GIB
    assert [m.plan.cpu_tier.bytes for m in fleet.models.values()] == [tier, tier]
    assert all(m.plan.notes.problems == () for m in fleet.models.values())
    assert fleet.notes.problems == ()
    assert fleet.models["chat"].away_ram_bytes == holds + tier
    assert any("equal share" in d for d in fleet.notes.decisions)


def test_on_a_cpu_host_models_stop_and_each_is_planned_alone(tmp_path: Path) -> None:
    data = two_models(tmp_path)
    data["kv_offload"] = {"backend": "none"}
    fleet = fleet_of(data, make_host(None), "cpu")
    assert {m.idle for m in fleet.models.values()} == {"stop"}
    assert all(m.config.gpu.memory_utilization == 0.9 for m in fleet.models.values())
    assert "residency.idle auto -> stop" in fleet.notes.decisions[0]
    asleep = fleet_of({**data, "residency": {"idle": "sleep"}}, make_host(None), "cpu")
    assert [p["field"] for p in asleep.notes.problems] == ["residency.idle"]


def test_a_set_the_host_cannot_hold_is_refused_with_the_numbers(tmp_path: Path) -> None:
    small = declared(make_host(None), gpu_mem_gib=80, ram_gib=40)
    fleet = fleet_of(two_models(tmp_path, max_resident=1), small)
    (problem,) = fleet.notes.problems
    assert problem["field"] == "models"
    assert (
        "'chat'" in problem["message"]
        and "of host RAM more than this host has" in (problem["message"])
    )
    assert "residency.idle = 'stop'" in problem["message"]
    stopping = fleet_of(two_models(tmp_path, idle="stop"), small)
    assert stopping.notes.problems == ()  # one engine at a time fits


def test_sleeping_refuses_the_host_extension_and_shared_disk_tiers(tmp_path: Path) -> None:
    data = two_models(tmp_path, max_resident=1)
    data["models"][1]["kv_offload"] = {"host_extension_gib": 4}
    fleet = fleet_of(data, big_host())
    assert [p["field"] for p in fleet.notes.problems] == ["models[1].kv_offload.host_extension_gib"]
    disk = tmp_path / "nvme"
    disk.mkdir()
    shared = two_models(tmp_path, max_resident=1)
    shared["kv_offload"] = {"disk_path": str(disk)}
    fleet = fleet_of(shared, big_host())
    assert "kv_offload.disk_path" in [p["field"] for p in fleet.notes.problems]


def test_several_resident_models_need_their_shares_to_fit(tmp_path: Path) -> None:
    fleet = fleet_of(two_models(tmp_path, max_resident=2), big_host())
    assert [p["field"] for p in fleet.notes.problems] == ["residency.max_resident"]
    shares = two_models(tmp_path, max_resident=2)
    for entry in shares["models"]:
        entry["gpu"] = {"memory_utilization": 0.45}
    assert fleet_of(shares, big_host()).notes.problems == ()


def test_a_model_that_cannot_fit_is_named_by_its_entry(tmp_path: Path) -> None:
    data = two_models(tmp_path)
    data["models"][1]["max_model_len"] = 131072
    with pytest.raises(PlanError) as info:
        fleet_of(data, declared(make_host(None), gpu_mem_gib=24, ram_gib=256))
    assert info.value.field == "models[1].max_model_len"
    assert info.value.message.startswith("'coder': ")


def test_the_two_model_example_passes_its_own_check(tmp_path: Path) -> None:
    """examples/config-two-models.toml on the host it describes (an RTX 4090, 128 GB):
    prepared as `serve` prepares it, no problem, and its figures as the README shows."""
    from vllm_offload.box.prepare import prepare_box
    from vllm_offload.config import load

    example = load(Path(__file__).parents[2] / "examples/config-two-models.toml")
    data = example.model_dump()
    data["server"]["api_key_file"] = ""
    for entry in data["models"]:
        name = Path(entry["path"]).name
        shape = dict(LLAMA3_8B, max_position_embeddings=131072)
        entry["path"] = str(write_shape(tmp_path / name, QWEN25_7B if "Qwen" in name else shape))
    host = declared(make_host(None), gpu_mem_gib=24, ram_gib=128)
    prepared = prepare_box(parse(data), host, {}, None)
    assert prepared.problems == ()
    chat, coder = prepared.plan.models["chat"], prepared.plan.models["coder"]
    assert chat.idle == "sleep" and coder.plan.cpu_tier.bytes == 16 * GIB
    # beside the other model asleep on a 24 GB card (CUDA graphs counted): the coder's
    # 16,384 tokens fit its pool; the chat's 'auto' is what one request can have in its own
    assert coder.plan.length.max_model_len == 16384 <= coder.plan.length.longest_request_tokens
    assert chat.plan.length.max_model_len == chat.plan.length.longest_request_tokens == 6784


def test_auto_keeps_two_models_that_fit_together_on_the_gpu(tmp_path: Path) -> None:
    """Issue #43 (1c): two 8B models of 8,192 tokens on an 80 GB card fit together: both
    resident (never a switch), no sleeper's reserve, each share its need and half the
    slack, each pool holding its max_model_len; `plan` says so."""
    data = two_models(tmp_path)
    for entry in data["models"]:
        entry["max_model_len"] = 8192
    fleet = fleet_of(data, big_host())
    assert fleet.max_resident == 2 and fleet.notes.problems == ()
    (decision,) = [d for d in fleet.notes.decisions if d.startswith("residency.max_resident")]
    assert "auto -> 2" in decision and "asleep" not in decision
    shares = [m.config.gpu.memory_utilization for m in fleet.models.values()]
    assert sum(shares) <= 0.9 and shares[0] == shares[1]  # equal models, equal shares
    for model in fleet.models.values():
        need = gpu_need(model.config, model.model, model.plan)
        assert model.plan.gpu.budget_bytes >= need  # its share holds what it needs
        assert model.plan.length.max_model_len == 8192 <= model.plan.length.longest_request_tokens
        assert model.plan.weights.offloaded_bytes == 0
    # nobody sleeps: no engine keeps a host copy of its weights (one put away by hand stops)
    assert {m.idle for m in fleet.models.values()} == {"stop"}
    assert all(m.away_ram_bytes == 0 for m in fleet.models.values())
    assert any(
        d.startswith("residency.idle auto -> stop: every model stays on the GPU")
        for d in fleet.notes.decisions
    )


def test_auto_takes_as_many_as_fit_and_the_rest_sleep(tmp_path: Path) -> None:
    """Three 8B models on a 48 GB card: two fit beside one asleep, three do not."""
    data = two_models(tmp_path)
    third = write_shape(tmp_path / "third", dict(LLAMA3_8B, max_position_embeddings=131072))
    data["models"].append({"path": str(third)})
    for entry in data["models"]:
        entry["max_model_len"] = 8192
    host = declared(make_host(None), gpu_mem_gib=48, ram_gib=256)
    fleet = fleet_of(data, host)
    assert fleet.max_resident == 2 and fleet.notes.problems == ()
    (decision,) = [d for d in fleet.notes.decisions if d.startswith("residency.max_resident")]
    assert "auto -> 2" in decision and "1 asleep beside them" in decision
    shares = sorted(m.config.gpu.memory_utilization for m in fleet.models.values())
    assert sum(shares[-2:]) + ASLEEP_GPU_BYTES / (48 * GIB) <= 0.9  # any two, and a sleeper


def test_auto_is_one_when_no_two_fit_and_on_a_cpu_host(tmp_path: Path) -> None:
    small_card = declared(make_host(None), gpu_mem_gib=24, ram_gib=256)
    fleet = fleet_of(two_models(tmp_path), small_card)
    assert fleet.max_resident == 1
    assert any(
        d.startswith("residency.max_resident auto -> 1: no two models fit")
        for d in fleet.notes.decisions
    )
    assert {m.idle for m in fleet.models.values()} == {"sleep"}  # one on the GPU, one asleep
    data = two_models(tmp_path)
    data["kv_offload"] = {"backend": "none"}
    on_cpu = fleet_of(data, make_host(None), "cpu")
    assert on_cpu.max_resident == 1
    assert any("auto -> 1: no NVIDIA GPU" in d for d in on_cpu.notes.decisions)


def test_auto_turn_is_none_with_level_1_sleep_and_5_s_where_a_switch_is_slow(
    tmp_path: Path,
) -> None:
    """Issue #43 (1b), measured on an H200 (benchmarks/results/h200-vllm-0.33.0/turns/):
    with level-1 sleep (a switch 0.5 s) no turns served 1 and 4 people per model best;
    where a switch reads the weights again (level 2) or restarts the engine (stop), 5 s
    turns keep the box from switching for each request. `plan` says which, where models
    switch; a number is kept as it is."""

    def turn(platform: str = "cuda", **residency: Any) -> tuple[float, list[str]]:
        data = two_models(tmp_path, max_resident=1, **residency)
        host = big_host()
        if platform == "cpu":
            data["kv_offload"], host = {"backend": "none"}, make_host(None)
        fleet = fleet_of(data, host, platform)
        assert box_json(fleet)["min_resident_s"] == fleet.min_resident_s
        said = [d for d in fleet.notes.decisions if d.startswith("residency.min_resident_s")]
        return fleet.min_resident_s, said

    assert turn() == (
        0.0,
        [
            "residency.min_resident_s auto -> 0: level-1 sleep: a switch is the weights' copy "
            "(0.5 s for an 8B model on an H200, where no turns served people best at every "
            "load measured; a larger model or a slower link: set seconds) "
            "(docs/several-models.md)"
        ],
    )
    level_2, said = turn(sleep_level=2)
    assert level_2 == 5.0 and said[0].startswith("residency.min_resident_s auto -> 5: level-2")
    # issue #58: with the copy given back each put-away copies the weights out (6.5-8.6 s a
    # switch on the H200): turns, as for level 2
    released, said = turn(host_copy="release")
    assert released == 5.0 and "copies the weights out" in said[0]
    stop, said = turn(idle="stop")
    assert stop == 5.0 and "restarts the engine" in said[0]
    on_cpu, said = turn("cpu")  # idle 'auto' without an NVIDIA GPU: stop
    assert on_cpu == 5.0 and "restarts the engine" in said[0]
    assert turn(min_resident_s=2) == (2.0, [])
    assert turn(min_resident_s=0, sleep_level=2) == (0.0, [])
    # every model on the GPU: no switch, nothing to say about turns
    data = two_models(tmp_path, max_resident=2)
    together = fleet_of(data, big_host())
    assert not any("min_resident_s" in d for d in together.notes.decisions)


def three_models(tmp_path: Path, host_copy: str) -> dict[str, Any]:
    shape = dict(LLAMA3_8B, max_position_embeddings=131072)
    paths = [write_shape(tmp_path / name, shape) for name in ("a", "b", "c")]
    models = [{"path": str(p), "max_model_len": 8192} for p in paths]  # CPU tiers 'auto'
    return {"models": models, "residency": {"max_resident": 1, "host_copy": host_copy}}


def test_a_released_host_copy_shows_less_ram_serving_and_fits_no_more_models(
    tmp_path: Path,
) -> None:
    """Issue #58: a serving engine kept its sleep copy of the weights whatever the host had.
    residency.host_copy = 'release' gives it back: the engine on the GPU holds the copy
    less (`ps` says so), and the plan says what a put-away then costs. It fits no more
    models: at a switch the model put away copies its weights out while the one coming in
    still holds its copy, so three 8B models at level 1 on a 64 GiB host are refused
    either way, and on a 96 GiB host get the same CPU tiers either way."""
    roomy = declared(make_host(None), gpu_mem_gib=80, ram_gib=96)
    tight = declared(make_host(None), gpu_mem_gib=80, ram_gib=64)
    kept, given = (fleet_of(three_models(tmp_path, c), roomy) for c in ("keep", "release"))
    assert kept.keeps_copy and not given.keeps_copy
    assert not kept.notes.problems and not given.notes.problems
    copy = kept.models["a"].plan.weights.gpu_bytes + SLEEP_POOLS_BYTES
    assert kept.models["a"].serving_ram_bytes == kept.models["a"].away_ram_bytes
    assert given.models["a"].serving_ram_bytes == given.models["a"].away_ram_bytes - copy
    assert any("no more models fit" in d for d in given.notes.decisions)
    assert box_json(given)["host_copy"] == "release" and box_json(kept)["host_copy"] == "keep"
    tiers = {n: m.plan.cpu_tier.bytes for n, m in kept.models.items()}
    assert tiers == {n: m.plan.cpu_tier.bytes for n, m in given.models.items()}
    for host_copy in ("keep", "release"):
        refused = fleet_of(three_models(tmp_path, host_copy), tight)
        assert [p["field"] for p in refused.notes.problems] == ["models"]


def test_models_with_fixed_pools_that_sleep_take_their_need_as_their_share(
    tmp_path: Path,
) -> None:
    """Issue #58: three 8B models with 8 GiB pools, one on the GPU at a time, on a 140 GiB
    card. Each planned 0.86 of the GPU (the GPU less two asleep), which vLLM checks is free
    as it starts: one start after another. A fixed pool needs its weights, working memory
    and the pool: that (and a margin) is its share, and all three start side by side."""
    from vllm_offload.plan.box_start import START_MARGIN_BYTES

    data = two_models(tmp_path, max_resident=1)
    third = write_shape(tmp_path / "notes", dict(LLAMA3_8B, max_position_embeddings=131072))
    data["models"].append({"path": str(third)})
    data["gpu"] = {"kv_cache_memory_bytes": 8 << 30}
    host = declared(make_host(None), gpu_mem_gib=140, ram_gib=512)
    fleet = fleet_of(data, host)
    for model in fleet.models.values():
        need = gpu_need(model.config, model.model, model.plan) + START_MARGIN_BYTES
        share = model.config.gpu.memory_utilization
        assert need <= share * 140 * GIB < need + 0.001 * 140 * GIB
        assert model.plan.gpu.kv_pool_bytes == 8 << 30 and model.plan.notes.problems == ()
    assert fleet.start_batches == (("notes", "coder", "chat"),)
    assert sum("so that engines start side by side" in d for d in fleet.notes.decisions) == 3
    # a pool that fills the share: one start at a time
    auto = fleet_of(two_models(tmp_path, max_resident=1), host)
    assert auto.start_batches == (("coder",), ("chat",))
