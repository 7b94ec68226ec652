"""Plan -> launch spec (argv, env, KVTransferConfig) -> vLLM's OpenAI server.

The spec is plain data so ``--dry-run`` can print it anywhere. Running it
validates the KVTransferConfig with vLLM's own class, then runs vLLM's server
module in this very process, exactly as ``python -m`` would: the PID stays the
one systemd started (its signals reach vLLM) and vLLM is imported once — an
``exec`` after validating would import it twice (~10 s on a CPU host).
"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_offload import disk_layout
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import Refused
from vllm_offload.hardware import GIB
from vllm_offload.plan import Plan
from vllm_offload.vllm_version import (
    API_KEY_ENV,
    AUTO_MAX_MODEL_LEN,
    SERVER_MODULE,
    v2_runner_ignores_cpu_offload,
)

# The OffloadingConnector spec that puts secondary tiers behind the CPU tier.
DISK_TIER_SPEC = "TieringOffloadingSpec"
# LMCache's in-process connector is configured through its environment.
LMCACHE_CHUNK_TOKENS = 256
# Patch 0001's check of the CPU tier against host RAM keeps this much free; the launcher
# passes the planner's reserve, so the planner and vLLM apply one rule.
CPU_TIER_RESERVE_ENV = "VLLM_CPU_TIER_RAM_RESERVE_BYTES"
# Patch 0006 reads the host extension's size (bytes per GPU) from vLLM's additional config.
HOST_EXTENSION_KEY = "kv_host_extension_bytes"


class PreflightError(Refused):
    """Something that would make vLLM fail or misbehave here; names the field and the fix."""


@dataclass(frozen=True)
class LaunchSpec:
    args: tuple[str, ...]
    env: dict[str, str]
    kv_transfer_config: dict[str, Any] | None
    notes: tuple[str, ...] = ()
    secret_env: tuple[str, ...] = field(default=())  # names whose values are never printed

    def command_line(self, python: str = sys.executable) -> list[str]:
        return [python, "-m", SERVER_MODULE, *self.args]

    def printable(self, python: str = sys.executable) -> str:
        env = " ".join(
            f"{k}={'***' if k in self.secret_env else shlex.quote(v)}"
            for k, v in sorted(self.env.items())
        )
        cmd = shlex.join(self.command_line(python))
        return f"{env} {cmd}" if env else cmd


def kv_transfer_config(config: DeploymentConfig, plan: Plan) -> dict[str, Any] | None:
    if plan.kv.backend == "native":
        extra: dict[str, Any] = {
            "cpu_bytes_to_use": plan.cpu_tier.bytes,
            "eviction_policy": config.kv_offload.eviction_policy,
            "layerwise_loads": config.kv_offload.layerwise_loads,
        }
        if plan.kv.chunk_tokens != plan.kv.block_tokens:  # vLLM's default: one GPU block
            extra["block_size"] = plan.kv.chunk_tokens
        if config.kv_offload.store_threshold >= 2:  # below 2 vLLM stores every chunk
            extra["store_threshold"] = config.kv_offload.store_threshold
        if plan.disk.bytes:
            # vLLM's tiering spec: the CPU tier in front, its filesystem tier behind, bounded
            # by our subclass (vLLM's own out-of-tree tier hook loads it by module path).
            extra["spec_name"] = DISK_TIER_SPEC
            extra["secondary_tiers"] = [{
                "type": "BoundedFsTier",
                "module_path": "vllm_offload.disk_tier",
                "root_dir": plan.disk.root,
                "budget_root": str(disk_layout.tier_root(plan.disk.path)),
                "max_bytes": plan.disk.bytes,
                "min_free_bytes": plan.disk.reserve_bytes,
            }]  # fmt: skip
        return {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
    if plan.kv.backend == "lmcache":
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    return None


def max_model_len_arg(plan: Plan) -> str:
    """A configured length as it is (the planner checked it fits); 'auto' as vLLM's own
    auto-fit, which sizes it from the pool it measures, so the estimate of a GPU pool the
    planner makes before anything is loaded can never start a server whose longest request
    does not fit. vLLM's auto-fit is for one request: for several at once the planner's
    length goes (vLLM still refuses to start if its measured pool cannot hold one)."""
    if plan.length.source == "configured" or plan.length.min_concurrent_requests > 1:
        return str(plan.length.max_model_len)
    return AUTO_MAX_MODEL_LEN


def served_name(config: DeploymentConfig, model_dir: Path) -> str:
    return config.model.served_name or model_dir.name


def build(
    config: DeploymentConfig,
    plan: Plan,
    model_dir: Path,
    vllm_version: str,
    api_key: str | None = None,
) -> LaunchSpec:
    """The exact server invocation for ``plan``; pure."""
    args: list[str] = [
        "--model", str(model_dir),
        "--served-model-name", served_name(config, model_dir),
        "--host", config.server.host,
        "--port", str(config.server.port),
        "--block-size", str(plan.kv.block_tokens),
        "--max-model-len", max_model_len_arg(plan),
    ]  # fmt: skip
    if config.model.dtype != "auto":
        args += ["--dtype", config.model.dtype]
    if plan.kv.cache_dtype != "auto":  # as resolved: 'fit' may have chosen fp8
        args += ["--kv-cache-dtype", plan.kv.cache_dtype]
    if plan.platform == "cuda":
        args += ["--gpu-memory-utilization", str(config.gpu.memory_utilization)]
    if config.gpu.kv_cache_memory_bytes != "auto" or plan.platform == "cpu":
        args += ["--kv-cache-memory-bytes", str(plan.gpu.kv_pool_bytes)]
    parallel = config.parallel
    if parallel.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(parallel.tensor_parallel_size)]
    if parallel.pipeline_parallel_size > 1:
        args += ["--pipeline-parallel-size", str(parallel.pipeline_parallel_size)]
    if parallel.distributed_executor_backend != "auto":
        args += ["--distributed-executor-backend", parallel.distributed_executor_backend]

    env: dict[str, str] = {}
    notes: list[str] = [f"KV offload backend: {plan.kv.backend} "
                        f"({plan.kv.backend_reason})"]  # fmt: skip
    if plan.weights.offloaded_bytes > 0:
        params = config.weights_offload.params
        args += ["--offload-backend", config.weights_offload.backend]
        if plan.weights.offloaded_layers:  # prefetch sizes by layers; it ignores cpu_offload_gb
            args += [
                "--offload-group-size", str(plan.weights.prefetch_group_size),
                "--offload-num-in-group", str(plan.weights.prefetch_num_in_group),
                "--offload-prefetch-step", str(config.weights_offload.prefetch_step),
            ]  # fmt: skip
            if params:
                args += ["--offload-params", *params]
        else:
            args += ["--cpu-offload-gb", f"{plan.weights.offloaded_bytes / GIB:.3f}"]
            if params:
                args += ["--cpu-offload-params", *params]
        if v2_runner_ignores_cpu_offload(vllm_version):
            env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
            notes.append(
                f"set VLLM_USE_V2_MODEL_RUNNER=0: vLLM {vllm_version}'s V2 model runner "
                "ignores cpu_offload_gb"
            )

    if plan.extension.bytes:  # read by patch 0006 (vllm/v1/core/kv_host_extension.py)
        extension = {HOST_EXTENSION_KEY: plan.extension.bytes}
        args += ["--additional-config", json.dumps(extension, separators=(",", ":"))]
    kv_config = kv_transfer_config(config, plan)
    if kv_config is not None:
        args += ["--kv-transfer-config", json.dumps(kv_config, separators=(",", ":"))]
    if plan.cpu_tier.bytes:
        env[CPU_TIER_RESERVE_ENV] = str(plan.host_ram.reserve_bytes)
    if plan.kv.backend == "lmcache":
        env.update(
            LMCACHE_LOCAL_CPU="True",
            LMCACHE_MAX_LOCAL_CPU_SIZE=f"{plan.cpu_tier.bytes / GIB:.3f}",
            LMCACHE_CHUNK_SIZE=str(LMCACHE_CHUNK_TOKENS),
            # LMCache reports usage to stats.lmcache.ai unless told not to.
            LMCACHE_TRACK_USAGE="false",
        )
    secret: tuple[str, ...] = ()
    if api_key is not None:
        env[API_KEY_ENV] = api_key
        secret = (API_KEY_ENV,)
    args += config.extra_args
    return LaunchSpec(tuple(args), env, kv_config, tuple(notes), secret)


def read_api_key(config: DeploymentConfig) -> str | None:
    path = config.server.api_key_file
    if not path:
        return None
    if os.path.exists(path) and (mode := os.stat(path).st_mode & 0o777) & 0o026:
        raise PreflightError(
            "server.api_key_file",
            f"{path} has mode {mode:o}: other users can read it, or its group can write it; "
            "chmod 600 it (640 to share it with the manager's group)",
        )
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise PreflightError(
            "server.api_key_file",
            f"cannot read {path}: {exc.strerror}; fix the path or "
            'its permissions, or set it to "" for no key',
        ) from None
    if not key:
        raise PreflightError("server.api_key_file", f"{path} is empty; write the key into it")
    return key


def validate_with_vllm(spec: LaunchSpec) -> None:
    """Parse the KVTransferConfig with vLLM's own class (imports vLLM: seconds)."""
    if spec.kv_transfer_config is None:
        return
    from vllm.config import KVTransferConfig

    try:
        KVTransferConfig(**spec.kv_transfer_config)
    except Exception as exc:  # vLLM raises pydantic and plain ValueErrors alike
        raise PreflightError("kv_offload", f"vLLM rejects the KV transfer config: {exc}") from exc


def run(spec: LaunchSpec) -> None:
    """Become vLLM's OpenAI server: same process, same PID, as ``python -m`` does."""
    os.environ.update(spec.env)
    validate_with_vllm(spec)
    sys.argv = [SERVER_MODULE, *spec.args]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
