"""Plan -> launch spec (argv, env, KVTransferConfig; ``launch_spec``'s records), the
pre-flight reads (the API key). ``run_vllm`` runs the spec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_offload import launch_kv
from vllm_offload.config import DeploymentConfig
from vllm_offload.config.schema import model_name
from vllm_offload.hardware import GIB
from vllm_offload.launch_spec import EngineLaunch, LaunchSpec, PreflightError
from vllm_offload.plan import Plan
from vllm_offload.plan.lengths import ALLOW_LONG_LEN_ENV
from vllm_offload.safe_files import read_secret
from vllm_offload.upstream.version import (
    API_KEY_ENV,
    AUTO_MAX_MODEL_LEN,
)
from vllm_offload.vllm_ext import forwarded_routes
from vllm_offload.vllm_ext.knobs import (
    CPU_TIER_RESERVE_ENV,
    LAYERED_WAKE_WORKER,
    SLEEP_ARENA_ENV,
    SLEEP_KEEP_COPY_ENV,
    SLEEP_WEIGHTS_ON_GPU_ENV,
)

# vLLM opens /sleep and /wake_up with it (and other development routes: an engine that
# sleeps is reached through its own unix socket alone).
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
# What a start takes before it answers (issue #56: nothing said so, and vLLM's wait reads
# like a hang): measured in docs/install.md ("How long a start takes").
FIRST_START = {
    "cpu": "the first start of a model and its settings compiles it before it answers: "
    "about 3 min on a 2-core CPU host for the demo model; later starts read the compile "
    "cache (~/.cache/vllm) and take about 1.5",
    "cuda": "the first start of a model and its settings compiles it and captures CUDA "
    "graphs before it answers: about 2.5 min for an 8B model on an H200; later starts read "
    "the compile cache (~/.cache/vllm)",
}
# vLLM 0.32's AOT compile cache fails to load on its CPU platform ("'function' object has
# no attribute 'finalize_loading'") and every start compiled again: 138 s to /health warm
# against 184 s cold on a 2-core host; without it Inductor's own cache serves, 78 s warm
# (issue #56; benchmarks/results/cpu-host/first-start/).
CPU_COMPILE_CACHE_ENV = {"VLLM_USE_AOT_COMPILE": "0"}
# server.reproducible: Inductor's deterministic mode (no combo-kernel benchmark, one config
# per reduction kernel) in the config vLLM patches into every compile (the environment's
# TORCHINDUCTOR_DETERMINISTIC reached vLLM's own check but not the engine's compile on the
# H200: its fused add + RMSNorm kernel still timed two block sizes), and vLLM's Triton
# autotuners on their first valid config.
DETERMINISTIC_INDUCTOR = "--compilation-config.inductor_compile_config.deterministic"
REPRODUCIBLE_ENV = {"TORCHINDUCTOR_DETERMINISTIC": "1", "VLLM_TRITON_FORCE_FIRST_CONFIG": "1"}


def _dest(flag: str) -> str:
    """The name vLLM's parser gives ``flag``'s value in its namespace."""
    return flag.removeprefix("--").replace("-", "_")


class _Options:
    """The options the launcher writes, each one ``--flag=value`` token (a value that
    starts with "-" or holds a "." can then never be read as an option of its own), with
    the value vLLM's parser must read back."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self.owned: dict[str, Any] = {}

    def add(self, flag: str, value: str | int | float | dict[str, Any], read: Any = None) -> None:
        """``flag=value``; ``read``: what vLLM's parser makes of it, when not ``value``."""
        text = json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)
        self.args.append(f"{flag}={text}")
        self.owned[_dest(flag)] = value if read is None else read

    def add_flag(self, flag: str) -> None:
        """A switch that takes no value (vLLM's store_true options)."""
        self.args.append(flag)
        self.owned[_dest(flag)] = True

    def add_off(self, flag: str) -> None:
        """``--no-flag``: a switch of vLLM's that its parser reads as ``flag`` False."""
        self.args.append("--no-" + flag.removeprefix("--"))
        self.owned[_dest(flag)] = False

    def add_list(self, flag: str, values: list[str]) -> None:
        """An option of several values (vLLM's nargs='+'), as separate tokens: config
        validation keeps each to a name that cannot start with "-"."""
        self.args += [flag, *values]
        self.owned[_dest(flag)] = list(values)


def max_model_len_arg(plan: Plan) -> str:
    """A configured length as it is (the planner checked it fits); 'auto' as vLLM's own
    auto-fit, which sizes it from the pool it measures, so the estimate of a GPU pool the
    planner makes before anything is loaded can never start a server whose longest request
    does not fit. vLLM's auto-fit is for one request: for several at once the planner's
    length goes (vLLM still refuses to start if its measured pool cannot hold one)."""
    if plan.length.source == "configured" or plan.length.min_concurrent_requests > 1:
        return str(plan.length.max_model_len)
    return AUTO_MAX_MODEL_LEN


def build(
    config: DeploymentConfig,
    plan: Plan,
    model_dir: Path,
    *,
    api_key: str | None = None,
    engine: EngineLaunch | None = None,
) -> LaunchSpec:
    """The exact server invocation for ``plan`` (``engine``: as one of several models);
    pure. It decides nothing: every value is the plan's (made for the vLLM release it
    will run on) or the config's as it is."""
    options = _Options()
    options.add("--model", str(model_dir))
    name = model_name(config.model)  # the folder's name, unless configured
    options.add("--served-model-name", name, read=[name])
    env: dict[str, str] = {}
    _listen(options, env, config, engine)
    options.add("--block-size", plan.kv.block_tokens)
    options.add("--max-model-len", int(max_model_len_arg(plan)))
    if plan.length.max_model_len > plan.length.model_max_tokens:  # allowed on purpose
        env[ALLOW_LONG_LEN_ENV] = "1"
    if config.model.dtype != "auto":
        options.add("--dtype", config.model.dtype)
    if plan.kv.cache_dtype != "auto":  # as resolved: 'fit' may have chosen fp8
        options.add("--kv-cache-dtype", plan.kv.cache_dtype)
    if plan.platform == "cuda":
        options.add("--gpu-memory-utilization", config.gpu.memory_utilization)
    if plan.platform == "cpu":  # a start reads the compile cache (CPU_COMPILE_CACHE_ENV)
        env.update(CPU_COMPILE_CACHE_ENV)
    if plan.reproducible:  # kernels chosen by rule, not by timing (plan/reproducible.py)
        options.add_off("--enable-flashinfer-autotune")
        options.add(DETERMINISTIC_INDUCTOR, "true", read=True)
        env.update(REPRODUCIBLE_ENV)
    # vLLM's default chunk, and the adjustments vLLM makes to it, stay vLLM's
    if plan.prefill.source in ("configured", "host extension"):
        options.add("--max-num-batched-tokens", plan.prefill.tokens)
    if config.gpu.kv_cache_memory_bytes != "auto" or plan.platform == "cpu":
        options.add("--kv-cache-memory-bytes", plan.gpu.kv_pool_bytes)
    _parallel(options, config, plan.tensor_parallel_size)
    notes: list[str] = [
        f"KV offload backend: {plan.kv.backend} ({plan.kv.backend_reason})",
        FIRST_START[plan.platform],
    ]
    if plan.weights.offloaded_bytes > 0:
        _weight_offload(options, config, plan)
    if plan.extension.bytes:
        extension = launch_kv.host_extension(config, plan)
        env.update(extension.env)
        if extension.scheduler_cls:
            options.add("--scheduler-cls", extension.scheduler_cls)
        options.add("--additional-config", extension.additional_config)
    sleeps = engine is not None and engine.sleeps
    kv_config = launch_kv.kv_transfer_config(config, plan, sleeps)
    if kv_config is not None:
        options.add("--kv-transfer-config", kv_config)
    if plan.cpu_tier.bytes:
        env[CPU_TIER_RESERVE_ENV] = str(plan.host_ram.reserve_bytes)
    if plan.kv.backend == "lmcache":
        env.update(launch_kv.lmcache_env(plan))
    secret: tuple[str, ...] = ()
    if api_key is not None:
        env[API_KEY_ENV] = api_key
        secret = (API_KEY_ENV,)
    extra = tuple(config.extra_args)
    return LaunchSpec(
        args=tuple(options.args) + extra,
        env=env,
        kv_transfer_config=kv_config,
        notes=tuple(notes),
        secret_env=secret,
        owned=options.owned,
        extra_args=extra,
    )


def _listen(
    options: _Options, env: dict[str, str], config: DeploymentConfig, engine: EngineLaunch | None
) -> None:
    """Where the server listens: server.host:port, or an engine's unix socket (and, for an
    engine that sleeps, vLLM's sleep mode with our arena)."""
    if engine is None:
        options.add("--host", config.server.host)
        options.add("--port", config.server.port)
        return
    options.add("--uds", engine.socket)
    if engine.gpus:  # NVML numbers GPUs in PCI bus order; CUDA, unless told, fastest first
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, engine.gpus))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # What the front door forwards reaches OpenAI routes only (vllm_ext/forwarded_routes)
    options.add("--middleware", forwarded_routes.MIDDLEWARE, read=[forwarded_routes.MIDDLEWARE])
    if engine.sleeps:
        options.add_flag("--enable-sleep-mode")
        env[DEV_MODE_ENV] = "1"
        env[SLEEP_ARENA_ENV] = "1"  # its weights wait in one exact-size arena
        if engine.weights_on_gpu:  # the last of them stay on the GPU (vllm_ext/sleep.py)
            env[SLEEP_WEIGHTS_ON_GPU_ENV] = str(engine.weights_on_gpu)
        if not engine.keeps_copy:  # given back after each wake (vllm_ext/sleep.py)
            env[SLEEP_KEEP_COPY_ENV] = "0"
        elif engine.layered_wake:  # the worker that wakes layer by layer
            options.add("--worker-cls", LAYERED_WAKE_WORKER)


def _parallel(options: _Options, config: DeploymentConfig, tp: int) -> None:
    """``tp``: the plan's (the config's, or the split it chose: plan.box_gpus)."""
    parallel = config.parallel
    if tp > 1:
        options.add("--tensor-parallel-size", tp)
    if parallel.pipeline_parallel_size > 1:
        options.add("--pipeline-parallel-size", parallel.pipeline_parallel_size)
    if parallel.distributed_executor_backend != "auto":
        options.add("--distributed-executor-backend", parallel.distributed_executor_backend)


def _weight_offload(options: _Options, config: DeploymentConfig, plan: Plan) -> None:
    """The weight-offload options."""
    params = config.weights_offload.params
    options.add("--offload-backend", config.weights_offload.backend)
    if plan.weights.offloaded_layers:  # prefetch sizes by layers; it ignores cpu_offload_gb
        options.add("--offload-group-size", plan.weights.prefetch_group_size)
        options.add("--offload-num-in-group", plan.weights.prefetch_num_in_group)
        options.add("--offload-prefetch-step", config.weights_offload.prefetch_step)
        if params:
            options.add_list("--offload-params", params)
    else:
        options.add("--cpu-offload-gb", float(f"{plan.weights.offloaded_bytes / GIB:.3f}"))
        if params:
            options.add_list("--cpu-offload-params", params)


def read_api_key(config: DeploymentConfig) -> str | None:
    """The key in server.api_key_file: a small regular file (a FIFO there would hang
    every status poll of the manager) that other users cannot read."""
    path = config.server.api_key_file
    if not path:
        return None
    try:
        return read_secret(path)
    except OSError as exc:
        raise PreflightError(
            "server.api_key_file",
            f'cannot read {path} ({exc}); fix the path or its permissions, or set it to "" '
            "for no key",
        ) from None
    except ValueError as exc:
        raise PreflightError("server.api_key_file", str(exc)) from None
