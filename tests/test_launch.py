from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_host
from vllm_offload import launch, launch_kv, launch_spec, run_vllm
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.config.schema import ConfigError
from vllm_offload.hardware import GIB
from vllm_offload.model import facts as model_facts
from vllm_offload.model import real as real_model
from vllm_offload.plan import Plan, PlanError, make_plan


def plan_for(demo_dir: Path, overrides: dict[str, object], gpu_gib: float = 24) -> Plan:
    config = with_overrides(DeploymentConfig(), {"model.path": str(demo_dir), **overrides})
    return make_plan(config, model_facts.read(demo_dir), make_host(gpu_gib), "cuda")


def spec_for(
    demo_dir: Path,
    overrides: dict[str, object],
    gpu_gib: float | None = 24,
    version: str = "0.32.0",
    api_key: str | None = None,
) -> launch_spec.LaunchSpec:
    config = with_overrides(DeploymentConfig(), {"model.path": str(demo_dir), **overrides})
    host = make_host(gpu_gib)
    platform = "cuda" if gpu_gib else "cpu"
    plan = make_plan(config, model_facts.read(demo_dir), host, platform, vllm_release=version)
    return launch.build(config, plan, demo_dir, api_key=api_key)


def flag(spec: launch_spec.LaunchSpec, name: str) -> str:
    value = spec.option(name)
    assert value is not None, (name, spec.args)
    return value


def test_native_backend_builds_offloading_connector(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"kv_offload.backend": "native", "kv_offload.cpu_tier_gib": 4})
    kv = json.loads(flag(spec, "--kv-transfer-config"))
    assert kv == spec.kv_transfer_config
    assert kv["kv_connector"] == "OffloadingConnector"
    assert kv["kv_role"] == "kv_both"
    assert kv["kv_connector_extra_config"] == {
        "cpu_bytes_to_use": 4 * GIB,
        "eviction_policy": "lru",
        "layerwise_loads": True,  # patch 0005: a hit loads inside its prefill's step
        "block_size": 256,  # 'auto' CPU chunk with the native tier: two 128-token blocks
    }
    assert flag(spec, "--block-size") == "128"
    assert "num_cpu_blocks" not in json.dumps(kv)
    # vLLM 0.33 loads a hit inside its step within a budget: layer-wise, no limit (the pool)
    on_033 = spec_for(demo_dir, {"kv_offload.backend": "native"}, version="0.33.0")
    assert on_033.kv_transfer_config is not None
    assert on_033.kv_transfer_config["kv_connector_extra_config"]["sync_load_budget_bytes"] == (
        plan_for(demo_dir, {"kv_offload.backend": "native"}).gpu.kv_pool_bytes
    )


def test_cpu_chunk_tokens(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"kv_offload.backend": "native", "kv_offload.cpu_chunk_tokens": 256})
    assert spec.kv_transfer_config is not None
    assert spec.kv_transfer_config["kv_connector_extra_config"]["block_size"] == 256
    with pytest.raises(PlanError) as info:
        spec_for(
            demo_dir,
            {
                "kv_offload.backend": "native",
                "kv_offload.cpu_chunk_tokens": 100,
                "kv_offload.block_size": 16,
            },
        )
    assert info.value.field == "kv_offload.cpu_chunk_tokens" and "use 112" in info.value.message
    one_block = spec_for(
        demo_dir, {"kv_offload.backend": "native", "kv_offload.cpu_chunk_tokens": 128}
    )
    assert one_block.kv_transfer_config is not None  # vLLM's default needs no key
    assert "block_size" not in one_block.kv_transfer_config["kv_connector_extra_config"]


def test_auto_backend_is_native_with_gpu_and_none_without(demo_dir: Path) -> None:
    with_gpu = spec_for(demo_dir, {})
    assert with_gpu.kv_transfer_config is not None
    assert with_gpu.kv_transfer_config["kv_connector"] == "OffloadingConnector"
    assert any("auto: an NVIDIA GPU is present" in n for n in with_gpu.notes)
    without = spec_for(demo_dir, {}, gpu_gib=None)
    assert without.kv_transfer_config is None
    assert without.option("--kv-transfer-config") is None
    assert any("no NVIDIA GPU" in n for n in without.notes)


def test_lmcache_backend(demo_dir: Path) -> None:
    """The kv-transfer-config goes through vLLM's own KVTransferConfig here. LMCache's
    config class cannot be imported on this CPU host (importing lmcache loads torch-CUDA
    extensions, and LMCache 0.5.6 is not installed without a GPU), so its reading of the
    environment is proven on the GPU host: release.sh's lmcache case, whose server logs
    the tier size LMCache took from LMCACHE_MAX_LOCAL_CPU_SIZE."""
    spec = spec_for(demo_dir, {"kv_offload.backend": "lmcache", "kv_offload.cpu_tier_gib": 2})
    assert spec.kv_transfer_config == {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    run_vllm.validate(spec)
    assert spec.env["LMCACHE_LOCAL_CPU"] == "True"
    assert spec.env["LMCACHE_MAX_LOCAL_CPU_SIZE"] == "2.000"
    assert spec.env["LMCACHE_TRACK_USAGE"] == "false"  # no usage reports to lmcache.ai


def test_none_backend(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"kv_offload.backend": "none"})
    assert spec.kv_transfer_config is None
    assert spec.option("--kv-transfer-config") is None


def test_legacy_num_cpu_blocks_is_translated(demo_dir: Path) -> None:
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(demo_dir), "kv_offload.num_cpu_blocks": 1000}
    )
    facts = model_facts.read(demo_dir)
    plan = make_plan(config, facts, make_host(24), "cuda")
    # demo model: 2 layers x (K+V) x 4 heads x 64 dims x 2 bytes; the seed's blocks held
    # vLLM's default 16 tokens, whatever block size is planned now
    assert plan.kv.bytes_per_token == 2 * 2 * 4 * 64 * 2
    assert plan.cpu_tier.bytes == 1000 * plan.kv.bytes_per_token * 16
    assert any("num_cpu_blocks is deprecated" in w for w in plan.notes.warnings)
    kv = launch_kv.kv_transfer_config(config, plan)
    assert kv is not None
    assert kv["kv_connector_extra_config"]["cpu_bytes_to_use"] == plan.cpu_tier.bytes


def test_common_flags(demo_dir: Path) -> None:
    spec = spec_for(
        demo_dir,
        {
            "server.port": 8123,
            "model.served_name": "demo",
            "parallel.tensor_parallel_size": 2,
            "parallel.distributed_executor_backend": "ray",
            "extra_args": ["--enforce-eager"],
        },
    )
    assert flag(spec, "--model") == str(demo_dir)
    assert flag(spec, "--port") == "8123"
    assert flag(spec, "--host") == "127.0.0.1"
    assert flag(spec, "--served-model-name") == "demo"
    assert flag(spec, "--tensor-parallel-size") == "2"
    assert flag(spec, "--distributed-executor-backend") == "ray"
    assert spec.args[-1] == "--enforce-eager"


def test_kv_cache_dtype_flag(demo_dir: Path) -> None:
    assert flag(spec_for(demo_dir, {"model.kv_cache_dtype": "fp8"}), "--kv-cache-dtype") == "fp8"
    assert spec_for(demo_dir, {}).option("--kv-cache-dtype") is None


def test_cpu_platform_sizes_the_pool_explicitly(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"gpu.kv_cache_memory_bytes": 64 << 20}, gpu_gib=None)
    assert flag(spec, "--kv-cache-memory-bytes") == str(64 << 20)
    assert spec.option("--gpu-memory-utilization") is None


def test_weight_offload_flags(demo_dir: Path) -> None:
    spec = spec_for(
        demo_dir, {"weights_offload.cpu_gib": 0.001, "weights_offload.params": ["visual"]}
    )
    assert flag(spec, "--offload-backend") == "uva"
    assert float(flag(spec, "--cpu-offload-gb")) == pytest.approx(0.001, abs=1e-3)
    assert spec.args[spec.args.index("--cpu-offload-params") :][:2] == (
        "--cpu-offload-params",
        "visual",
    )


def test_prefetch_backend_passes_layers_and_vllm_parses_them(tmp_path: Path) -> None:
    from vllm.config.offload import OffloadConfig, PrefetchOffloadConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from tests.shapes import LLAMA3_8B, write_shape

    model = write_shape(tmp_path, LLAMA3_8B)
    spec = spec_for(
        model,
        {
            "weights_offload.cpu_gib": 8.0,
            "weights_offload.backend": "prefetch",
            "weights_offload.prefetch_step": 2,
            "weights_offload.params": ["mlp"],
        },
    )
    assert spec.option("--cpu-offload-gb") is None  # the prefetch backend ignores it
    parser = make_arg_parser(FlexibleArgumentParser())  # the server's own parser
    engine = EngineArgs.from_cli_args(parser.parse_args(spec.args))
    assert engine.offload_backend == "prefetch" and engine.cpu_offload_gb == 0
    prefetch = PrefetchOffloadConfig(
        offload_group_size=engine.offload_group_size,
        offload_num_in_group=engine.offload_num_in_group,
        offload_prefetch_step=engine.offload_prefetch_step,
        offload_params=engine.offload_params,
    )
    OffloadConfig(offload_backend="prefetch", prefetch=prefetch)  # vLLM's own checks
    assert (prefetch.offload_group_size, prefetch.offload_num_in_group) == (6, 4)
    assert prefetch.offload_prefetch_step == 2 and prefetch.offload_params == {"mlp"}


def test_layerwise_loads_can_be_turned_off(demo_dir: Path) -> None:
    spec = spec_for(
        demo_dir,
        {"kv_offload.backend": "native", "kv_offload.layerwise_loads": "false"},
        version="0.33.0",
    )
    assert spec.kv_transfer_config is not None
    extra = spec.kv_transfer_config["kv_connector_extra_config"]
    assert extra["layerwise_loads"] is False
    assert "sync_load_budget_bytes" not in extra  # vLLM's default: async loads


def test_vllms_sync_loads_without_layerwise_waits(demo_dir: Path) -> None:
    """vLLM 0.33's own sync loads (the worker waits for the whole load before the step),
    the arm patch 0005 is measured against."""
    spec = spec_for(
        demo_dir,
        {
            "kv_offload.backend": "native",
            "kv_offload.layerwise_loads": "false",
            "kv_offload.sync_load_budget_gib": 0.5,
        },
        version="0.33.0",
    )
    assert spec.kv_transfer_config is not None
    assert spec.kv_transfer_config["kv_connector_extra_config"]["sync_load_budget_bytes"] == (
        GIB // 2
    )


def test_the_host_extension_reaches_vllm_as_its_additional_config(demo_dir: Path) -> None:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from vllm_offload.vllm_ext.fair_scheduler import FairScheduler

    spec = spec_for(
        demo_dir,
        {"kv_offload.host_extension_gib": 1.5, "kv_offload.spilled_step_share": 0.4},
    )
    parser = make_arg_parser(FlexibleArgumentParser())  # the server's own parser
    engine = EngineArgs.from_cli_args(parser.parse_args(spec.args))
    assert engine.additional_config == {
        "kv_host_extension_bytes": 3 << 29,
        "kv_spilled_step_share": 0.4,
    }
    # issue #42: the scheduler that shares the GPU beside a spilled request, by module path
    assert resolve_obj_by_qualname(str(engine.scheduler_cls)) is FairScheduler
    without = spec_for(demo_dir, {})
    assert without.option("--additional-config") is None
    assert without.option("--scheduler-cls") is None
    alone = spec_for(
        demo_dir, {"kv_offload.host_extension_gib": 1.5, "kv_offload.spilled_step_share": 1.0}
    )  # share 1: patch 0006 alone
    assert json.loads(flag(alone, "--additional-config")) == {"kv_host_extension_bytes": 3 << 29}
    assert alone.option("--scheduler-cls") is None
    default = spec_for(demo_dir, {"kv_offload.host_extension_gib": 1.5})  # measured: 0.1
    assert json.loads(flag(default, "--additional-config"))["kv_spilled_step_share"] == 0.1
    assert default.option("--scheduler-cls") is not None


def test_staged_prefill_reaches_vllm_on_0_33_with_its_scratch(demo_dir: Path) -> None:
    """Issue #41: a pool whose requests can spill gets the plan's scratch in vLLM's
    additional config and the plugin's FlashAttention (STAGED_PREFILL_ENV); vLLM 0.32.0
    and kv_offload.staged_prefill = false get neither."""
    from vllm_offload.vllm_ext.knobs import STAGED_PREFILL_ENV

    small = {
        "gpu.kv_cache_memory_bytes": 8 << 20,
        "kv_offload.block_size": 16,
        "kv_offload.host_extension_gib": 8 / 1024,
    }
    spec = spec_for(demo_dir, small, version="0.33.0")
    assert json.loads(flag(spec, "--additional-config")) == {
        "kv_host_extension_bytes": 8 << 20,
        "kv_staging_tokens": 2048,
        "kv_spilled_step_share": 0.1,
    }
    assert spec.env[STAGED_PREFILL_ENV] == "1"
    for off in (
        spec_for(demo_dir, small, version="0.32.0"),
        spec_for(demo_dir, {**small, "kv_offload.staged_prefill": False}, version="0.33.0"),
    ):
        assert json.loads(flag(off, "--additional-config")) == {
            "kv_host_extension_bytes": 8 << 20,
            "kv_spilled_step_share": 0.1,
        }
        assert STAGED_PREFILL_ENV not in off.env


def test_store_threshold_reaches_the_connector(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"kv_offload.backend": "native", "kv_offload.store_threshold": 2})
    assert spec.kv_transfer_config is not None
    assert spec.kv_transfer_config["kv_connector_extra_config"]["store_threshold"] == 2
    default = spec_for(demo_dir, {"kv_offload.backend": "native"})
    assert default.kv_transfer_config is not None
    assert "store_threshold" not in default.kv_transfer_config["kv_connector_extra_config"]


def test_api_key_goes_to_env_not_argv(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {}, api_key="s3cret-key")
    assert spec.env["VLLM_API_KEY"] == "s3cret-key"
    assert not any("s3cret" in a for a in spec.args)
    assert "s3cret" not in spec.printable()
    assert "VLLM_API_KEY=***" in spec.printable()


def test_offload_without_gpu_is_a_problem_of_the_plan(demo_dir: Path) -> None:
    """Still planned and built (a dry run prints a GPU host's command anywhere), but a
    deployment refuses to start on it."""
    spec = spec_for(demo_dir, {"kv_offload.backend": "native"}, gpu_gib=None)
    assert spec.kv_transfer_config is not None
    config = with_overrides(DeploymentConfig(), {"kv_offload.backend": "native"})
    plan = make_plan(config, model_facts.read(demo_dir), make_host(None), "cpu")
    assert plan.notes.problems == (
        {
            "field": "kv_offload.backend",
            "message": "CPU KV offload needs an NVIDIA GPU; set kv_offload.backend = none",
        },
    )


def test_the_tier_must_fit_ram_and_shm(demo_dir: Path) -> None:
    """Problems of the plan itself (issue #30: `plan` and `serve --dry-run` refuse the same
    things), with the reserve the launcher hands to vLLM's own check."""
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(demo_dir), "kv_offload.cpu_tier_gib": 100}
    )
    facts = model_facts.read(demo_dir)
    host = make_host(24, ram_gib=64, shm_gib=32)
    errors = make_plan(config, facts, host, "cuda").notes.problems
    assert [e["field"] for e in errors] == ["kv_offload.cpu_tier_gib"] * 2
    # 64 GiB less the 8 GiB reserve and ~3.75 GiB for vLLM's own processes
    assert "the largest that fits is 52 GiB" in errors[0]["message"]
    assert "/dev/shm" in errors[1]["message"] and "<= 31" in errors[1]["message"]
    ok = make_plan(with_overrides(config, {"kv_offload.cpu_tier_gib": 16}), facts, host, "cuda")
    assert ok.notes.problems == ()
    assert launch.build(config, ok, demo_dir).env[launch.CPU_TIER_RESERVE_ENV] == str(
        8 * GIB
    )  # vLLM's own check keeps the planner's reserve


def every_flag_spec(demo_dir: Path) -> launch_spec.LaunchSpec:
    """A spec that writes every flag the launcher can write."""
    return spec_for(
        demo_dir,
        {
            "model.served_name": "m",
            "model.dtype": "bfloat16",
            "model.kv_cache_dtype": "fp8",
            "model.max_model_len": 64,
            "gpu.kv_cache_memory_bytes": 1 << 30,
            "kv_offload.backend": "native",
            "kv_offload.cpu_tier_gib": 1,
            "weights_offload.cpu_gib": 0.001,
            "weights_offload.params": ["mlp"],
            "parallel.tensor_parallel_size": 2,
            "parallel.pipeline_parallel_size": 2,
            "parallel.distributed_executor_backend": "mp",
            "kv_offload.host_extension_gib": 0.5,
        },
    )


def test_flags_the_launcher_writes_are_refused_from_extra_args(demo_dir: Path) -> None:
    """Every flag the launcher writes is in config.LAUNCHER_FLAGS (so passing it by hand is
    refused); every refused flag is one vLLM's own server parser knows; and no other
    option of that parser is refused, though the check also catches abbreviations."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from vllm_offload.config import LAUNCHER_FLAGS, UNSUPPORTED_FLAGS, refused_flag

    def whole_options(spec: launch_spec.LaunchSpec) -> set[str]:
        """The options a spec writes whole (a dotted one, launch.DETERMINISTIC_INDUCTOR,
        sets one field inside vLLM's value and is merged with the administrator's)."""
        names = {a.split("=", 1)[0] for a in spec.args if a.startswith("--")}
        return {n for n in names if "." not in n}

    written = whole_options(every_flag_spec(demo_dir))
    prefetch = spec_for(
        demo_dir,
        {
            "weights_offload.cpu_gib": 0.001,
            "weights_offload.backend": "prefetch",
            "weights_offload.params": ["mlp"],
        },
    )
    written |= whole_options(prefetch)
    assert written - set(LAUNCHER_FLAGS) == set()
    options = set(make_arg_parser(FlexibleArgumentParser())._option_string_actions)
    refused = (set(LAUNCHER_FLAGS) | set(UNSUPPORTED_FLAGS)) - {"--swap-space"}  # gone upstream
    assert refused - options == set()
    assert {o for o in options if refused_flag(o)} == refused
    assert refused_flag(["--max-model", "8192"][0])  # vLLM's parser takes the prefix


def test_reproducible_pins_what_vllm_would_choose_by_timing(demo_dir: Path) -> None:
    """Issue #54: server.reproducible (on by default) reaches vLLM as Inductor's
    deterministic mode, its Triton autotuners' first config and no FlashInfer autotuning,
    read back by vLLM's own parser; off, or on vLLM's CPU platform, none of it."""
    from vllm_offload import argv_check

    spec = spec_for(demo_dir, {})
    assert spec.env.items() >= launch.REPRODUCIBLE_ENV.items()
    assert spec.owned["enable_flashinfer_autotune"] is False
    assert f"{launch.DETERMINISTIC_INDUCTOR}=true" in spec.args
    argv_check.check(spec)  # vLLM's own parser reads it so
    dotted = spec_for(demo_dir, {"extra_args": ["--compilation-config.cudagraph_mode=PIECEWISE"]})
    argv_check.check(dotted)  # merged with the launcher's field
    whole = {"extra_args": ['--compilation-config={"cudagraph_mode":"NONE"}']}
    with pytest.raises(ConfigError, match="give each field dotted"):
        spec_for(demo_dir, whole)  # vLLM's parser would drop it for the launcher's dotted one
    spec_for(demo_dir, {**whole, "server.reproducible": False})  # nothing set: as given
    for off in (spec_for(demo_dir, {"server.reproducible": False}), spec_for(demo_dir, {}, None)):
        assert not set(off.env) & set(launch.REPRODUCIBLE_ENV)
        assert not any("flashinfer-autotune" in a for a in off.args)
    with pytest.raises(ConfigError, match=r"server\.reproducible"):
        with_overrides(DeploymentConfig(), {"extra_args": ["--enable-flashinfer-autotune"]})


def test_a_cpu_host_starts_from_its_compile_cache(demo_dir: Path) -> None:
    """Issue #56: vLLM 0.32's AOT compile cache failed to load on the CPU platform, so every
    start compiled again (138 s warm against 184 s cold); off, Inductor's cache serves."""
    assert spec_for(demo_dir, {}, None).env["VLLM_USE_AOT_COMPILE"] == "0"
    assert "VLLM_USE_AOT_COMPILE" not in spec_for(demo_dir, {}).env  # a GPU's is vLLM's


def test_read_api_key(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("abc\n")
    config = with_overrides(DeploymentConfig(), {"server.api_key_file": str(key_file)})
    with pytest.raises(launch_spec.PreflightError, match="mode 644: other users can read it"):
        launch.read_api_key(config)  # issue #15: accepted without a word
    key_file.chmod(0o640)  # shared with the manager's group
    assert launch.read_api_key(config) == "abc"
    missing = with_overrides(config, {"server.api_key_file": str(tmp_path / "nope")})
    with pytest.raises(launch_spec.PreflightError, match=r"server\.api_key_file"):
        launch.read_api_key(missing)


def test_kv_transfer_config_is_accepted_by_vllm(demo_dir: Path) -> None:
    spec = spec_for(demo_dir, {"kv_offload.backend": "native", "kv_offload.cpu_tier_gib": 1})
    run_vllm.validate(spec)  # raises if vLLM's own class rejects it
    from vllm.config import KVTransferConfig

    parsed = KVTransferConfig(**json.loads(flag(spec, "--kv-transfer-config")))
    assert parsed.kv_connector == "OffloadingConnector"
    assert parsed.kv_connector_extra_config["cpu_bytes_to_use"] == GIB
    bad = launch_spec.LaunchSpec(
        args=(),
        env={},
        kv_transfer_config={"kv_connector": "OffloadingConnector", "kv_role": "sideways"},
    )
    with pytest.raises(launch_spec.PreflightError, match="vLLM rejects"):
        run_vllm.validate(bad)


def test_every_vllm_name_in_the_env_is_one_vllm_knows(demo_dir: Path) -> None:
    """vLLM warns of each VLLM_* variable it does not know, on every start ("Unknown vLLM
    environment variable detected: VLLM_CPU_TIER_RAM_RESERVE_BYTES" was the first line a
    GPU user saw): ours are named outside that prefix."""
    import vllm.envs

    from vllm_offload.vllm_ext import knobs

    spec = spec_for(
        demo_dir,
        {
            "kv_offload.backend": "native",
            "kv_offload.host_extension_gib": 1,
            "weights_offload.cpu_gib": 1,
        },
        version="0.33.0",
        api_key="k",
    )
    ours = [v for k, v in vars(knobs).items() if k.endswith("_ENV")] + [real_model.CACHE_ENV]
    assert len(ours) >= 5 and set(ours) & set(spec.env), (ours, spec.env)
    unknown = [
        name
        for name in [*spec.env, *ours]
        if name.startswith("VLLM_") and name not in vllm.envs.environment_variables
    ]
    assert not unknown, unknown


def test_the_old_cache_name_never_reaches_vllm(demo_dir: Path, tmp_path: Path) -> None:
    """A user's VLLM_OFFLOAD_CACHE (the cache folder's old name) is dropped from the
    environment vLLM reads, whose own check would warn of it (or fail, as here, hard)."""
    spec = spec_for(demo_dir, {"kv_offload.backend": "native"})
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_json()))
    code = (
        "import json, sys\n"
        "from vllm_offload import launch_spec, run_vllm\n"
        "run_vllm.enter_environment(launch_spec.LaunchSpec.from_json(json.load(open(sys.argv[1]))))\n"
        "from vllm.platforms import current_platform\n"
        "current_platform.validate_environ(hard_fail=True)\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("VLLM_")},  # the user's own
        "PYTHONPATH": str(Path(__file__).parents[1]),
        real_model.OLD_CACHE_ENV: str(tmp_path / "old"),
        real_model.CACHE_ENV: str(tmp_path / "new"),
    }
    done = subprocess.run(
        [sys.executable, "-c", code, str(spec_file)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_planned_prefill_chunk_reaches_vllm_as_one_token(tmp_path: Path) -> None:
    """Issue #41: a host-extended pool on a 24 GiB card prefills in 8,192-token chunks (vLLM's
    default there: 2,048): the launcher writes `--max-num-batched-tokens=8192`, one token,
    and vLLM's own parser and EngineArgs read 8,192; vLLM's default is left to vLLM."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from tests.shapes import LLAMA3_8B, write_shape
    from vllm_offload import argv_check

    model = write_shape(tmp_path / "llama-8b", LLAMA3_8B)

    def args_for(overrides: dict[str, object]) -> tuple[str, ...]:
        config = with_overrides(DeploymentConfig(), {"model.path": str(model), **overrides})
        plan = make_plan(config, model_facts.read(model), make_host(24), "cuda")
        spec = launch.build(config, plan, model)
        argv_check.check(spec)  # vLLM's parser reads what the plan says, or this exits 2
        return spec.args

    extended = args_for({"kv_offload.host_extension_gib": 2.0})
    assert [a for a in extended if "batched" in a] == ["--max-num-batched-tokens=8192"]
    parsed = argv_check._parser().parse_args(list(extended))
    assert AsyncEngineArgs.from_cli_args(parsed).max_num_batched_tokens == 8192
    configured = args_for({"gpu.prefill_chunk_tokens": 4096})
    assert [a for a in configured if "batched" in a] == ["--max-num-batched-tokens=4096"]
    assert not [a for a in args_for({}) if "batched" in a]  # vLLM's default: vLLM's
    unstaged = args_for({"kv_offload.host_extension_gib": 2.0, "kv_offload.staged_prefill": False})
    assert not [a for a in unstaged if "batched" in a]
    # a MoE's larger chunk would come out of its pool: the plan keeps vLLM's, and so vLLM does
    fork = Path(__file__).parents[1] / "benchmarks/models/qwen3-coder-30b-a3b-awq"
    config = with_overrides(
        DeploymentConfig(),
        {
            "model.path": str(fork),
            "model.max_model_len": 52000,
            "kv_offload.host_extension_gib": 2.0,
        },
    )
    plan = make_plan(config, model_facts.read(fork), make_host(24), "cuda")
    assert plan.prefill.source == "kept: larger costs pool"
    assert not [a for a in launch.build(config, plan, fork).args if "batched" in a]


def test_a_passed_through_chunk_is_refused_naming_the_key() -> None:
    """The planner counts the chunk's activations, so `serve -- --max-num-batched-tokens`
    (or an abbreviation) is refused for gpu.prefill_chunk_tokens, like every owned flag."""
    from vllm_offload.config import ConfigError

    for extra in (["--max-num-batched-tokens", "4096"], ["--max-num-batched=4096"]):
        with pytest.raises(ConfigError) as info:
            with_overrides(DeploymentConfig(), {"extra_args": extra})
        assert info.value.field == "extra_args"
        assert "gpu.prefill_chunk_tokens (`serve --gpu-prefill-chunk-tokens`)" in (
            info.value.message
        )


@pytest.mark.parametrize("release", ["0.32.0", "0.33.0"])
def test_the_launcher_asks_what_the_plan_shows_for_the_release(
    tmp_path: Path, release: str
) -> None:
    """Issue #57: the launcher decided by release what the plan never saw, so on a 0.32
    GPU host `plan` showed a staging scratch (and a smaller pool) the launcher never asked
    for. Now the plan is made for the release and the launcher writes what it holds: the
    scratch and the sync-load budget are in both or in neither."""
    from tests.shapes import LLAMA3_8B, write_shape
    from vllm_offload.vllm_ext.knobs import STAGING_TOKENS_KEY

    model = write_shape(tmp_path / "llama-8b", dict(LLAMA3_8B, max_position_embeddings=131072))
    overrides = {
        "model.path": str(model),
        "model.max_model_len": 32768,
        "kv_offload.host_extension_gib": 4.0,
        "gpu.kv_cache_memory_bytes": 2 * GIB,
    }
    config = with_overrides(DeploymentConfig(), overrides)
    plan = make_plan(config, model_facts.read(model), make_host(24), "cuda", vllm_release=release)
    spec = launch.build(config, plan, model)
    additional = json.loads(flag(spec, "--additional-config"))
    assert plan.vllm_release == release
    staged = release != "0.32.0"  # staged_attention fits 0.33.0's FlashAttention only
    assert bool(plan.extension.staging_scratch_bytes) == staged
    assert additional.get(STAGING_TOKENS_KEY, 0) == plan.extension.staging_scratch_tokens
    assert (STAGING_TOKENS_KEY in additional) == staged
    if not staged:
        assert any("vLLM 0.32.0's FlashAttention" in d for d in plan.notes.decisions)
    assert spec.kv_transfer_config is not None
    extra = spec.kv_transfer_config["kv_connector_extra_config"]
    assert bool(plan.cpu_tier.sync_load_budget_bytes) == (release != "0.32.0")
    assert extra.get("sync_load_budget_bytes", 0) == plan.cpu_tier.sync_load_budget_bytes
