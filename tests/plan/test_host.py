"""Issue #38: every byte a plan puts in host RAM fits the host less the reserve, or the plan
refuses naming the key and the largest value that fits."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.shapes import SHAPES, write_shape
from vllm_offload.cli import main
from vllm_offload.config import DeploymentConfig, parse, with_overrides
from vllm_offload.config.schema import engine_configs
from vllm_offload.model import facts as model_facts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import Plan, PlanError, make_plan
from vllm_offload.plan.box import BoxPlan, plan_box
from vllm_offload.plan.box_host import holds
from vllm_offload.plan.host import ram_reserve, server_ram_bytes
from vllm_offload.plan.records import BoxInputs, Platform

LLAMA_70B = Path(__file__).parents[2] / "benchmarks/models/llama-3.1-70b"


def test_offloaded_weights_larger_than_the_ram_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The issue's command: 121.9 GiB of weights offloaded on a 32 GiB host exited 0."""
    code = main(
        [
            "plan",
            "--model",
            str(LLAMA_70B),
            "--gpu-mem-gib",
            "24",
            "--ram-gib",
            "32",
            "--model-max-model-len",
            "32768",
            "--weights-offload-cpu-gib",
            "auto",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    # the most host RAM takes: 32 less the 8 GiB reserve, less ~3.75 GiB for vLLM itself
    assert "weights_offload.cpu_gib <= 20.2:" in err
    assert "no request length fits at all" in err
    assert "more host RAM (about 142 GiB available)" in err  # 142 is enough, 141 is not:
    for ram, code in (("142", 0), ("141", 2)):
        assert (
            main(
                [
                    "plan",
                    "--model",
                    str(LLAMA_70B),
                    "--gpu-mem-gib",
                    "24",
                    "--ram-gib",
                    ram,
                    "--model-max-model-len",
                    "32768",
                    "--weights-offload-cpu-gib",
                    "auto",
                ]
            )
            == code
        )


def test_configured_offload_past_the_ram_names_the_largest_that_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    declared = ["--model", str(LLAMA_70B), "--gpu-mem-gib", "80", "--ram-gib", "96"]
    assert main(["plan", *declared, "--weights-offload-cpu-gib", "90"]) == 2
    err = capsys.readouterr().err
    assert "weights_offload.cpu_gib: 90.00 GiB of offloaded weights do not fit" in err
    assert "set it <= 82.6," in err  # 96 less the 9.6 GiB reserve less ~3.75 GiB for vLLM
    assert main(["plan", *declared, "--weights-offload-cpu-gib", "82.6"]) == 0


def ram_placed(plan: Plan, pp: int) -> int:
    """Everything the plan puts in host RAM: vLLM's processes, offloaded weights and the
    host extension on every rank, and the CPU tier (all ranks together); on vLLM's CPU
    backend also every rank's weights and KV pool."""
    world = plan.tensor_parallel_size * pp
    per_rank = plan.weights.offloaded_bytes + plan.extension.bytes
    if plan.platform == "cpu":
        per_rank += plan.weights.gpu_bytes + plan.gpu.kv_pool_bytes
    return server_ram_bytes(world, plan.platform) + per_rank * world + plan.cpu_tier.bytes


def test_the_cpu_backend_refuses_weights_the_ram_cannot_hold(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On vLLM's CPU backend (this box, CI) the weights and the KV pool live in host RAM:
    the 70B model (131 GiB in bf16) on a 32 GiB host with no GPU exited 0."""
    declared = ["plan", "--model", str(LLAMA_70B), "--ram-gib", "32", "--json"]
    assert main([*declared, "--model-max-model-len", "2048"]) == 2
    err = capsys.readouterr().err
    assert "model.path: vLLM's CPU backend keeps the weights in host RAM" in err
    assert "host RAM holds 28.40 GiB" in err  # 32 less the 1.6 GiB reserve and ~2 for vLLM
    assert "more host RAM (about 142 GiB available)" in err  # 142 is enough, 141 is not:
    for ram, code in (("142", 0), ("141", 2)):
        argv = ["plan", "--model", str(LLAMA_70B), "--model-max-model-len", "2048"]
        assert main([*argv, "--ram-gib", ram]) == code


def test_the_cpu_backend_names_the_largest_pool_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A configured pool (or VLLM_CPU_KVCACHE_SPACE, which wins inside vLLM) past what the
    RAM holds beside the weights: refused naming the largest, which then plans."""
    model = write_shape(tmp_path / "8b", SHAPES["llama3-8b"])
    declared = ["plan", "--model", str(model), "--ram-gib", "32"]
    assert main([*declared, "--gpu-kv-cache-memory-bytes", str(20 * 2**30)]) == 2
    err = capsys.readouterr().err
    assert "gpu.kv_cache_memory_bytes: vLLM's CPU backend keeps the KV pool in host RAM" in err
    largest = err.split("set it <= ")[1].split(" ")[0]
    assert main([*declared, "--gpu-kv-cache-memory-bytes", largest]) == 0
    assert main([*declared, "--gpu-kv-cache-memory-bytes", str(int(largest) + 2**20)]) == 2
    host = make_host(None, ram_gib=32)
    config = with_overrides(DeploymentConfig(), {"model.path": str(model)})
    facts = model_facts.read(model)
    with pytest.raises(PlanError) as info:
        make_plan(config, facts, host, "cpu", env={"VLLM_CPU_KVCACHE_SPACE": "20"})
    assert info.value.field == "gpu.kv_cache_memory_bytes"
    assert "set VLLM_CPU_KVCACHE_SPACE <= 13" in info.value.message


def random_config(rng: random.Random, model_dir: Path) -> dict[str, Any]:
    return {
        "model.path": str(model_dir),
        "model.max_model_len": rng.choice(["auto", 2048, 8192, 32768, 131072]),
        "model.kv_cache_dtype": rng.choice(["auto", "fp8", "fit"]),
        "weights_offload.cpu_gib": rng.choice(["auto", 0, 4, 16, 48, 100]),
        "weights_offload.backend": rng.choice(["uva", "prefetch"]),
        "kv_offload.cpu_tier_gib": rng.choice(["auto", 0, 2, 16, 64]),
        "kv_offload.host_extension_gib": rng.choice([0, 0, 2, 8]),
        "gpu.min_concurrent_requests": rng.choice([1, 1, 4]),
        "parallel.tensor_parallel_size": rng.choice([1, 1, 2]),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[ModelFacts]:
    root = tmp_path_factory.mktemp("ram-shapes")
    dirs = [write_shape(root / name, cfg) for name, cfg in SHAPES.items()]
    return [model_facts.read(d) for d in [*dirs, LLAMA_70B]]


def test_a_plan_that_may_start_fits_the_host_ram(models: list[ModelFacts]) -> None:
    """Property over random models, hosts and configs (seeded, so a failure repeats): a plan
    with no problem never places more in host RAM than the host has less the reserve."""
    rng = random.Random(38)
    started = 0
    started_on = {"cuda": 0, "cpu": 0}
    for case in range(600):
        model = rng.choice(models)
        overrides = random_config(rng, Path(model.path))
        host = make_host(
            gpu_gib=rng.choice([8, 16, 24, 48, 80]),
            ram_gib=rng.choice([16, 24, 32, 64, 96, 128, 256]),
        )
        if overrides["parallel.tensor_parallel_size"] == 2:
            host = replace(host, gpus=host.gpus * 2)
        platform: Platform = rng.choice(["cuda", "cuda", "cpu"])
        if platform == "cpu":  # vLLM's CPU backend: no GPU, no tier; a pool as configured
            host = replace(host, gpus=())
            overrides["kv_offload.backend"] = "none"
            overrides["kv_offload.host_extension_gib"] = 0
            overrides["weights_offload.cpu_gib"] = 0
            overrides["gpu.kv_cache_memory_bytes"] = rng.choice(["auto", 2**30, 8 * 2**30])
        config = with_overrides(DeploymentConfig(), overrides)
        try:
            plan = make_plan(config, model, host, platform)
        except PlanError:
            continue
        if plan.notes.problems:
            continue
        started += 1
        started_on[platform] += 1
        room = host.ram_available_bytes - ram_reserve(host, platform)
        assert ram_placed(plan, 1) <= room, (case, model.architecture, overrides, host)
    # the property was tested on plans that start, not only refusals, on both platforms
    assert started > 100 and min(started_on.values()) > 30, started_on


def fleet_ram_placed(fleet: BoxPlan, level: int) -> int:
    """What the set holds in host RAM at once: every engine alive (asleep or serving) with
    its processes, offloaded weights, host extension, slept weights and CPU tier."""
    return sum(holds(m.plan, m.idle, level) + m.plan.cpu_tier.bytes for m in fleet.models.values())


def test_a_set_that_may_start_fits_the_host_ram(tmp_path: Path) -> None:
    """The same property for several models (slept models keep their weights in RAM)."""
    rng = random.Random(3831)
    dirs = [write_shape(tmp_path / name, cfg) for name, cfg in SHAPES.items()]
    started = 0
    for case in range(150):
        entries = []
        for i in range(rng.choice([2, 3])):
            entry = {
                "path": str(rng.choice(dirs)),
                "served_name": f"m{i}",
                "max_model_len": rng.choice(["auto", 4096, 16384]),
            }
            entry["weights_offload"] = {"cpu_gib": rng.choice(["auto", 0, 8])}
            entry["kv_offload"] = {"cpu_tier_gib": rng.choice(["auto", 0, 4, 32])}
            entries.append(entry)
        residency = {"idle": "sleep", "sleep_level": rng.choice([1, 2])}
        config = parse({"models": entries, "residency": residency})
        engines = engine_configs(config)
        facts = {n: model_facts.read(Path(c.model.path)) for n, c in engines.items()}
        host = make_host(gpu_gib=rng.choice([24, 48, 80]), ram_gib=rng.choice([32, 64, 128, 256]))
        try:
            fleet = plan_box(
                BoxInputs(
                    config=config,
                    engines=engines,
                    facts=facts,
                    disks={n: None for n in engines},
                    host=host,
                    platform="cuda",
                    vllm_release="0.33.0",
                    env={},
                )
            )
        except PlanError:
            continue
        if fleet.notes.problems or any(m.plan.notes.problems for m in fleet.models.values()):
            continue
        started += 1
        room = host.ram_available_bytes - ram_reserve(host, "cuda")
        assert fleet_ram_placed(fleet, config.residency.sleep_level) <= room, (
            case,
            entries,
            residency,
            host.ram_total_bytes,
        )
    assert started > 20
