"""Honest capacity accounting for the CPU KV tier (vLLM's OffloadingConnector), called
from vLLM's KV sizing by patch 0001.

vLLM V1 keeps a running request's whole KV in the GPU block pool; the CPU tier holds
blocks for prefix reuse and preemption only. This module sizes the tier from the
connector config, checks it against host RAM and /dev/shm before anything is allocated,
logs one capacity table, and words the error raised when max_model_len does not fit the
GPU pool so that nobody adds CPU bytes to it. Runs inside vLLM's engine core; imports
vLLM.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from typing import Any

import psutil
from vllm.logger import init_logger

from vllm_offload.vllm_ext.knobs import (
    CPU_BYTES_KEY,
    CPU_TIER_RESERVE_ENV,
    NUM_CPU_BLOCKS_KEY,
    env_bytes,
    gpu_host_ram_reserve,
)

logger = init_logger("vllm.vllm_offload.kv_capacity")  # under vLLM's logger: printed as its own

GiB = 1 << 30
OFFLOADING_CONNECTORS = ("OffloadingConnector",)
SHM_PATH = "/dev/shm"


@dataclass(frozen=True, kw_only=True)
class CpuTier:
    total_bytes: int  # cpu_bytes_to_use: all ranks together
    bytes_per_rank: int
    blocks: int  # in GPU blocks of one rank
    tokens: int
    uses_shm: bool  # the tier is an mmap of /dev/shm


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def offloading_extra_config(vllm_config: Any) -> dict[str, Any] | None:
    ktc = vllm_config.kv_transfer_config
    if ktc is None or ktc.kv_connector not in OFFLOADING_CONNECTORS:
        return None
    extra: dict[str, Any] = ktc.kv_connector_extra_config
    return extra


def model_kv_bytes_per_block(vllm_config: Any) -> int:
    """KV bytes of one GPU block on one rank, from the model config (attention layers)."""
    from vllm.utils.torch_utils import get_dtype_size, kv_cache_dtype_str_to_dtype

    model_config = vllm_config.model_config
    parallel_config = vllm_config.parallel_config
    cache_config = vllm_config.cache_config
    dtype = kv_cache_dtype_str_to_dtype(cache_config.cache_dtype, model_config)
    layers: int = model_config.get_num_layers(parallel_config)
    head_size: int = model_config.get_head_size()
    per_token = head_size * get_dtype_size(dtype)
    if not model_config.use_mla:
        per_token *= 2 * model_config.get_num_kv_heads(parallel_config)
    return layers * per_token * int(cache_config.block_size)


def translate_num_cpu_blocks(vllm_config: Any) -> None:
    """Accept the seed fork's `num_cpu_blocks` (ignored upstream) as cpu_bytes_to_use."""
    extra = offloading_extra_config(vllm_config)
    if extra is None or NUM_CPU_BLOCKS_KEY not in extra or extra.get(CPU_BYTES_KEY):
        return
    num_blocks = int(extra.pop(NUM_CPU_BLOCKS_KEY))
    total = num_blocks * model_kv_bytes_per_block(vllm_config)
    total *= vllm_config.parallel_config.world_size
    extra[CPU_BYTES_KEY] = total
    logger.warning(
        "kv_connector_extra_config.%s is deprecated: %d blocks translated to %s=%d (%s). "
        "Set %s instead.",
        NUM_CPU_BLOCKS_KEY,
        num_blocks,
        CPU_BYTES_KEY,
        total,
        _gib(total),
        CPU_BYTES_KEY,
    )


def offload_region_in_shm() -> bool:
    """Whether vLLM maps the tier from /dev/shm (CPUOffloadingSpec does on CUDA and XPU)."""
    from vllm.platforms import current_platform

    cuda = current_platform.is_cuda_alike() and not current_platform.is_rocm()
    return bool(cuda or current_platform.is_xpu())


def resolve_cpu_tier(vllm_config: Any, gpu_bytes_per_block: int, uses_shm: bool) -> CpuTier | None:
    """The CPU tier in bytes, GPU-block units and tokens per rank; None when there is none."""
    extra = offloading_extra_config(vllm_config)
    if extra is None or not extra.get(CPU_BYTES_KEY) or gpu_bytes_per_block <= 0:
        return None
    total = int(extra[CPU_BYTES_KEY])
    per_rank = total // max(1, vllm_config.parallel_config.world_size)
    blocks = per_rank // gpu_bytes_per_block
    return CpuTier(
        total_bytes=total,
        bytes_per_rank=per_rank,
        blocks=blocks,
        tokens=blocks * vllm_config.cache_config.block_size,
        uses_shm=uses_shm,
    )


def checked_cpu_tier(vllm_config: Any, gpu_bytes_per_block: int) -> CpuTier | None:
    """The CPU tier (None: none), refused before anything is allocated if the host
    cannot hold it."""
    tier = resolve_cpu_tier(vllm_config, gpu_bytes_per_block, offload_region_in_shm())
    if tier is not None:
        check_host_memory(tier)
    return tier


def ram_reserve_bytes(total_ram: int) -> int:
    """Host RAM the tier leaves for the OS, page cache and other processes: the planner's
    figure as the launcher passes it, else the planner's rule."""
    return env_bytes(CPU_TIER_RESERVE_ENV, gpu_host_ram_reserve(total_ram))


def _server_rss_bytes() -> int:
    """RAM this server's processes hold: the process that started this one (the API server,
    or the program that built the LLM) and all its descendants."""
    me = psutil.Process()
    parent = me.parent()
    root = parent if parent is not None and parent.pid > 1 else me
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # exited meanwhile
            total += proc.memory_info().rss
    return total


def _shm_free() -> int:
    try:
        return shutil.disk_usage(SHM_PATH).free
    except OSError:
        return 0


def check_host_memory(tier: CpuTier) -> None:
    """Refuse a tier the host cannot hold, before anything is allocated."""
    memory = psutil.virtual_memory()
    reserve = ram_reserve_bytes(memory.total)
    fits_ram = max(0, memory.available - reserve)
    problems = []
    if tier.total_bytes > fits_ram:
        problems.append(
            f"host RAM has {_gib(memory.available)} available and {_gib(reserve)} is kept in "
            f"reserve ({CPU_TIER_RESERVE_ENV}); the largest tier that fits is {fits_ram} "
            f"bytes ({fits_ram // GiB} GiB)"
        )
    shm_free = _shm_free() if tier.uses_shm else None
    if shm_free is not None and tier.total_bytes > shm_free:
        problems.append(
            f"the tier is mapped from {SHM_PATH}, which has {_gib(shm_free)} free; the "
            f"largest tier that fits is {shm_free} bytes ({shm_free // GiB} GiB), or "
            f"enlarge {SHM_PATH} (e.g. docker --shm-size)"
        )
    # What the planner must leave for this server besides the tier (vllm-offload plans it).
    logger.info(
        "CPU tier check: tier %s; host RAM available %s, reserve %s; this server's "
        "processes hold %s%s",
        _gib(tier.total_bytes),
        _gib(memory.available),
        _gib(reserve),
        _gib(_server_rss_bytes()),
        "" if shm_free is None else f"; {SHM_PATH} free {_gib(shm_free)}",
    )
    if problems:
        raise ValueError(
            f"The CPU KV tier (kv_connector_extra_config.{CPU_BYTES_KEY} = "
            f"{tier.total_bytes}, {_gib(tier.total_bytes)}; --kv-offloading-size) does not "
            "fit this host: " + "; ".join(problems) + "."
        )


def max_model_len_error(
    max_model_len: int,
    needed_bytes: int,
    pool_bytes: int,
    longest_fit: int,
    tier: CpuTier | None,
) -> ValueError:
    """vLLM's error for a max_model_len the GPU pool cannot hold, saying what fits and
    that the CPU tier does not lengthen a request."""
    tier_text = (
        f"The CPU KV tier ({_gib(tier.bytes_per_rank)} per rank, {tier.tokens:,} tokens) "
        "does not extend one request: vLLM keeps a running request's whole KV in the GPU "
        "pool; the CPU tier serves prefix reuse and preemption only."
        if tier is not None
        else "No CPU KV tier is configured; one would not extend one request either: vLLM "
        "keeps a running request's whole KV in the GPU pool."
    )
    fit_text = (
        f"The largest max_model_len that fits is {longest_fit:,}: set --max-model-len "
        f"{longest_fit} (or auto), or give the GPU pool more memory "
        "(--gpu-memory-utilization / --kv-cache-memory-bytes)."
        if longest_fit > 0
        else "Not even one token fits: give the GPU pool more memory "
        "(--gpu-memory-utilization / --kv-cache-memory-bytes)."
    )
    return ValueError(
        f"max_model_len {max_model_len:,} needs {_gib(needed_bytes)} of KV for one request, "
        f"but the GPU KV pool holds {_gib(pool_bytes)}. {tier_text} {fit_text}"
    )


def log_capacity_table(
    num_blocks: int,
    block_size: int,
    gpu_bytes_per_block: int,
    max_model_len: int,
    tier: CpuTier | None,
) -> None:
    usable = max(0, num_blocks - 1)  # the block pool holds one null block back
    gpu_tokens = usable * block_size
    lines = [
        "KV cache capacity (per rank):",
        f"  GPU pool : {_gib(num_blocks * gpu_bytes_per_block)} = {num_blocks:,} blocks of "
        f"{block_size} tokens = {gpu_tokens:,} tokens; one request may use all of it "
        f"(max_model_len {max_model_len:,})",
    ]
    if tier is None:
        lines.append("  CPU tier : none")
        reusable = gpu_tokens
    else:
        lines.append(
            f"  CPU tier : {_gib(tier.bytes_per_rank)} = {tier.blocks:,} blocks = "
            f"{tier.tokens:,} tokens, for prefix reuse and preemption (does not lengthen one "
            "request)"
        )
        reusable = gpu_tokens + tier.tokens
    lines.append(f"  reusable : {reusable:,} tokens (GPU pool + CPU tier)")
    logger.info("\n".join(lines))
