"""Every name patched vLLM and vllm_ext's hooks read, in one place: the launcher writes
them (launch.py, launch_kv.py), the hooks inside vLLM's processes read them. Plain strings,
no vLLM import: the launcher imports this module on hosts where vLLM is not importable yet.
``additional`` and ``whole_number`` are the one reader of our --additional-config keys,
``env_bytes`` of our byte-count variables."""

import os
from typing import Any

# Environment variables. Not named VLLM_*: vLLM warns of every VLLM_* name it does not know
# ("Unknown vLLM environment variable detected"), on each start.
# The RAM the CPU tier's check leaves free (bytes); the launcher passes the planner's
# reserve, so the planner and vLLM apply one rule (kv_capacity.check_host_memory).
CPU_TIER_RESERVE_ENV = "VLLMOFFLOAD_CPU_TIER_RAM_RESERVE_BYTES"
# The planner's reserve on a GPU host (plan.host.ram_reserve), and the check's where no
# launcher passed one: the larger of these bytes and this share of the host's RAM
# (gpu_host_ram_reserve).
RAM_RESERVE_BYTES = 8 << 30
RAM_RESERVE_FRACTION = 0.10
# Offloaded weights of at least this many bytes go into a registered host arena
# (host_pinning.gate_bytes).
PIN_REGISTER_MIN_ENV = "VLLMOFFLOAD_PIN_REGISTER_MIN_BYTES"
# With it set to 1 (the launcher does for engines that sleep), the plugin makes
# vllm_ext.sleep's backend the one vLLM's sleep mode uses.
SLEEP_ARENA_ENV = "VLLMOFFLOAD_SLEEP_ARENA"
# With it set to 0 (residency.host_copy planned 'release'), the sleep arena is given back
# after each wake and made again at the next sleep (vllm_ext.sleep).
SLEEP_KEEP_COPY_ENV = "VLLMOFFLOAD_SLEEP_KEEP_COPY"
# The bytes of its weights an engine asleep at level 1 keeps on the GPU (residency.
# asleep_weights_on_gpu_gib): its last weight allocations whose sizes add up to no more,
# neither copied out nor back (vllm_ext.sleep).
SLEEP_WEIGHTS_ON_GPU_ENV = "VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES"
# With it set to 1 (the launcher does for engines with staged prefill), the plugin puts
# vllm_ext.staged_attention's backend in the place of vLLM's FlashAttention.
STAGED_PREFILL_ENV = "VLLMOFFLOAD_STAGED_PREFILL"

# --additional-config keys.
# The KV pool's host extension, bytes of host RAM per GPU (kv_host_extension).
HOST_EXTENSION_KEY = "kv_host_extension_bytes"
# Staged prefill's GPU scratch, in tokens of one layer (staged_attention; plan/staging.py).
STAGING_TOKENS_KEY = "kv_staging_tokens"

# The OffloadingConnector's kv_connector_extra_config keys.
# The CPU tier, bytes over all ranks (vLLM's own key).
CPU_BYTES_KEY = "cpu_bytes_to_use"
# The seed fork's tier size in GPU blocks, translated to CPU_BYTES_KEY (kv_capacity).
NUM_CPU_BLOCKS_KEY = "num_cpu_blocks"
# A hit loads layer by layer inside the step that computes the rest of the prompt
# (patch 0005).
LAYERWISE_LOADS_KEY = "layerwise_loads"
# vLLM 0.33's per-step bytes of hits loaded inside the step (vLLM's own key; 0.32 has none).
SYNC_LOAD_BUDGET_KEY = "sync_load_budget_bytes"
# The share of wall time for steps with a request whose KV reaches host blocks
# (spill_share; fair_scheduler reads it).
SPILLED_STEP_SHARE_KEY = "kv_spilled_step_share"

# vLLM flag values.
# The scheduler that shares the GPU fairly beside a spilled request (--scheduler-cls).
FAIR_SCHEDULER = "vllm_offload.vllm_ext.fair_scheduler.FairScheduler"
# The worker whose level-1 wake copies the weights layer by layer (--worker-cls).
LAYERED_WAKE_WORKER = "vllm_offload.vllm_ext.layered_wake.LayeredWakeWorker"


def additional(vllm_config: Any, key: str, default: object) -> object:
    """``--additional-config``'s ``key`` as given (``default`` where there is no config, no
    additional config or no such key)."""
    given = getattr(vllm_config, "additional_config", None)
    return given.get(key, default) if isinstance(given, dict) else default


def whole_number(vllm_config: Any, key: str, unit: str) -> int:
    """``--additional-config``'s ``key``, a whole number of ``unit`` >= 0 (0 where absent);
    ValueError names the key."""
    value = additional(vllm_config, key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"--additional-config {key} must be a whole number of {unit} >= 0, not {value!r}"
        )
    return value


def env_bytes(name: str, default: int) -> int:
    """The environment variable ``name``, a whole number of bytes >= 0 (``default`` where
    it is unset or empty); ValueError names the variable."""
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        parsed = int(value)
    except ValueError:
        raise ValueError(
            f"{name} must be a whole number of bytes (e.g. 268435456), got {value!r}"
        ) from None
    if parsed < 0:
        raise ValueError(f"{name} must be >= 0, got {parsed}")
    return parsed


def gpu_host_ram_reserve(total_ram: int) -> int:
    """The host RAM a GPU host's CPU tier leaves free, of ``total_ram`` bytes."""
    return max(RAM_RESERVE_BYTES, int(total_ram * RAM_RESERVE_FRACTION))
