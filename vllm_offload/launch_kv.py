"""The KV cache's tiers as vLLM reads them (part of plan -> launch spec, ``launch.build``):
the OffloadingConnector's config (the native CPU tier, a disk tier behind it, the tier
kept through an engine's sleep), LMCache's environment, and the host extension's
additional config with the scheduler that shares the GPU beside a spilled request. Pure:
every value is the plan's or the config's as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_offload import disk_layout
from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB
from vllm_offload.plan import Plan
from vllm_offload.vllm_ext.knobs import (
    CPU_BYTES_KEY,
    FAIR_SCHEDULER,
    HOST_EXTENSION_KEY,
    LAYERWISE_LOADS_KEY,
    SPILLED_STEP_SHARE_KEY,
    STAGED_PREFILL_ENV,
    STAGING_TOKENS_KEY,
    SYNC_LOAD_BUDGET_KEY,
)

# The OffloadingConnector spec that puts secondary tiers behind the CPU tier.
DISK_TIER_SPEC = "TieringOffloadingSpec"
# LMCache's in-process connector is configured through its environment.
LMCACHE_CHUNK_TOKENS = 256
# The connector that keeps a model's CPU tier through its sleep (vllm_ext/connector.py).
SLEEPING_CONNECTOR_MODULE = "vllm_offload.vllm_ext.connector"


def kv_transfer_config(
    config: DeploymentConfig, plan: Plan, sleeps: bool = False
) -> dict[str, Any] | None:
    """vLLM's ``--kv-transfer-config`` for the planned backend; None for none."""
    if plan.kv.backend == "native":
        extra: dict[str, Any] = {
            CPU_BYTES_KEY: plan.cpu_tier.bytes,
            "eviction_policy": config.kv_offload.eviction_policy,
            LAYERWISE_LOADS_KEY: config.kv_offload.layerwise_loads,
        }
        if plan.cpu_tier.sync_load_budget_bytes:  # planned for the release (plan.host)
            extra[SYNC_LOAD_BUDGET_KEY] = plan.cpu_tier.sync_load_budget_bytes
        if plan.kv.chunk_tokens != plan.kv.block_tokens:  # vLLM's default: one GPU block
            extra["block_size"] = plan.kv.chunk_tokens
        if config.kv_offload.store_threshold >= 2:  # below 2 vLLM stores every chunk
            extra["store_threshold"] = config.kv_offload.store_threshold
        if plan.disk.bytes:
            # vLLM's tiering spec: the CPU tier in front, its filesystem tier behind, bounded
            # by our subclass (vLLM's own out-of-tree tier hook loads it by module path).
            extra["spec_name"] = DISK_TIER_SPEC
            extra["secondary_tiers"] = [
                {
                    "type": "BoundedFsTier",
                    "module_path": "vllm_offload.vllm_ext.disk_tier",
                    "root_dir": plan.disk.root,
                    "budget_root": str(disk_layout.tier_root(plan.disk.path)),
                    "max_bytes": plan.disk.bytes,
                    "min_free_bytes": plan.disk.reserve_bytes,
                }
            ]
        connector = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
        if sleeps:  # the tier survives the engine's sleep
            connector["kv_connector_module_path"] = SLEEPING_CONNECTOR_MODULE
        return connector
    if plan.kv.backend == "lmcache":
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    return None


def lmcache_env(plan: Plan) -> dict[str, str]:
    """LMCache's in-process connector is configured through its environment."""
    return {
        "LMCACHE_LOCAL_CPU": "True",
        "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{plan.cpu_tier.bytes / GIB:.3f}",
        "LMCACHE_CHUNK_SIZE": str(LMCACHE_CHUNK_TOKENS),
        # LMCache reports usage to stats.lmcache.ai unless told not to.
        "LMCACHE_TRACK_USAGE": "false",
    }


@dataclass(frozen=True, kw_only=True)
class HostExtension:
    """What the KV pool's host extension adds to a launch."""

    additional_config: dict[str, int | float]  # vLLM's --additional-config
    env: dict[str, str]
    scheduler_cls: str | None  # vLLM's --scheduler-cls; None: vLLM's own


def host_extension(config: DeploymentConfig, plan: Plan) -> HostExtension:
    """The KV pool's host extension, read by patch 0006 (vllm_ext/kv_host_extension.py),
    with staged prefill's scratch and the fair scheduler where planned."""
    additional: dict[str, int | float] = {HOST_EXTENSION_KEY: plan.extension.bytes}
    env: dict[str, str] = {}
    if plan.extension.staging_scratch_tokens:  # planned for the release (plan.staging)
        additional[STAGING_TOKENS_KEY] = plan.extension.staging_scratch_tokens
        env[STAGED_PREFILL_ENV] = "1"  # the plugin's FlashAttention (staged_attention)
    scheduler_cls = None
    share = config.kv_offload.spilled_step_share
    if share < 1:  # shares the GPU beside a spilled request (vllm_ext/fair_scheduler.py)
        additional[SPILLED_STEP_SHARE_KEY] = share
        scheduler_cls = FAIR_SCHEDULER
    return HostExtension(additional_config=additional, env=env, scheduler_cls=scheduler_cls)
