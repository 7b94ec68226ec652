"""The planner: (config, model facts, host facts) -> Plan. Pure; no I/O.

The rule it never bends: one request's KV must fit the GPU pool, because vLLM
never streams a request's blocks during attention. The CPU tier holds blocks
for *reuse* (prefix hits) and preemption; it does not make one request longer.
Every figure carries its unit in its name.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from vllm_offload import disk_layout
from vllm_offload.config import DeploymentConfig, flag_name
from vllm_offload.errors import FieldError
from vllm_offload.hardware import GIB, NETWORK_FILESYSTEMS, RAM_FILESYSTEMS, DiskFacts, HostFacts
from vllm_offload.model_facts import DTYPE_BYTES, LayerKind, ModelFacts

Platform = Literal["cuda", "cpu"]

# Host RAM kept free for the OS and page cache. The launcher hands this figure to patched
# vLLM (VLLM_CPU_TIER_RAM_RESERVE_BYTES), whose own check of the tier then agrees with
# the planner by construction.
RAM_RESERVE_BYTES = 8 * GIB
RAM_RESERVE_FRACTION = 0.10
# RAM vLLM's own processes hold when that check runs (after the model is loaded): on an
# H200 host, 8B shape, one GPU, 2.52-2.64 GiB on 0.32.0 and 0.25.0 (patch 0001 logs it:
# benchmarks/results/h200-vllm-0.32.0/capacity/). Without this allowance the default tier
# was refused there (issue #13). Each further GPU adds a worker process with its own CUDA
# context (not measured here: taken as 2 GiB).
SERVER_RAM_BYTES = 4 * GIB
SERVER_RAM_PER_EXTRA_RANK_BYTES = 2 * GIB
# /dev/shm vLLM uses itself before the check (its multi-process message queues).
SERVER_SHM_BYTES = 512 * 1024 * 1024
# GPU memory vLLM uses besides weights and the KV pool: CUDA context, activation
# peak during profiling and CUDA graphs. Measured on an H100 with an 8B shape
# (docs/benchmarks.md); scaled with the model's hidden size.
GPU_OVERHEAD_BASE_BYTES = int(1.0 * GIB)
GPU_OVERHEAD_PER_HIDDEN_BYTES = 128 * 1024
# vLLM's CPU attention needs blocks in multiples of 32; 16 is vLLM's default on GPUs.
DEFAULT_BLOCK_SIZE: dict[Platform, int] = {"cuda": 16, "cpu": 128}
# With the native CPU tier, bigger GPU blocks make each host<->GPU copy bigger: on an
# H200 a CPU hit of 1 GiB loaded at 35 GB/s with 16-token blocks and 49 GB/s with 128
# (TTFT 74 -> 64 ms), at no measured throughput cost (docs/benchmarks.md). Only for plain
# attention layers: MLA and hybrid models have backend-specific block sizes.
OFFLOAD_BLOCK_SIZE = 128
# Tokens per CPU-tier chunk with the native tier: fewer, larger transfers and lookups
# (CPU hit 80.6 -> 73.7 ms against one 16-token block per chunk, same run).
OFFLOAD_CHUNK_TOKENS = 256
# The CPU backend's KV pool when neither the config nor VLLM_CPU_KVCACHE_SPACE sizes it.
CPU_PLATFORM_DEFAULT_POOL_BYTES = 1 * GIB
# The disk tier never lets its filesystem's free space fall below this (the launcher hands
# it to the tier, which evicts to keep it); 'auto' sizes the tier at half of what is left.
DISK_RESERVE_BYTES = 10 * GIB
DISK_RESERVE_FRACTION = 0.05
DISK_AUTO_SHARE = 0.5
# Offloading weights 'auto' without a length to reach leaves room for one request this long.
AUTO_OFFLOAD_ROOM_TOKENS = 4096
# Patch 0006 maps the host extension in 2 MiB granules (vllm/v1/core/kv_host_extension.py).
HOST_MAP_GRANULE = 2 << 20
# Host->GPU copy speed of registered memory over PCIe Gen5 x16, measured on an H200
# (benchmarks/results/h200-vllm-0.32.0/weights/pinned_memory.json, 2 MiB blocks). Other
# links are this scaled by their transfer rate and width; every weight-offload decode step
# reads all offloaded bytes over it (UVA) or copies them in (prefetch).
H2D_GEN5_X16_BYTES_PER_S = 55.47e9
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
# Without a GPU to ask (a declared card): the link of an RTX 4090 / A6000-class card.
ASSUMED_PCIE = (4, 16)


class PlanError(FieldError):
    """The config cannot be served on this hardware; names the field and the fix."""


def kv_dtype_bytes(model: ModelFacts, dtype: str, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: the cache dtype if set, else the model's compute dtype."""
    if kv_cache_dtype != "auto":
        return DTYPE_BYTES[kv_cache_dtype]
    return compute_dtype_bytes(model, dtype)


def compute_dtype_bytes(model: ModelFacts, dtype: str) -> int:
    if dtype != "auto":
        return DTYPE_BYTES[dtype]
    # vLLM runs float32 checkpoints in half precision unless asked otherwise.
    return min(model.dtype_bytes, 2)


def layer_kv_bytes_per_token(
    layer: LayerKind, model: ModelFacts, dtype_bytes: int, tensor_parallel_size: int = 1
) -> int:
    """KV bytes one layer stores per token on one tensor-parallel rank."""
    if layer.kind == "linear":
        return 0
    if layer.kind == "mla":
        # MLA caches one latent (kv_lora_rank) plus the rope key, shared by all heads
        # and replicated on every rank.
        return (layer.kv_lora_rank + layer.rope_dim) * dtype_bytes
    # KV heads split across ranks; a rank holds at least one (replicated when tp > heads).
    heads_per_rank = max(1, model.num_kv_heads // tensor_parallel_size)
    return 2 * heads_per_rank * model.head_dim * dtype_bytes


def kv_bytes_per_token(model: ModelFacts, dtype_bytes: int, tensor_parallel_size: int = 1) -> int:
    """All layers' KV bytes per token on one rank, as a full-length request grows."""
    return sum(
        layer_kv_bytes_per_token(layer, model, dtype_bytes, tensor_parallel_size)
        for layer in model.layers
    )


def request_kv_bytes(
    model: ModelFacts, dtype_bytes: int, tokens: int, block_size: int, tp: int = 1
) -> int:
    """GPU bytes one request of ``tokens`` needs, in whole blocks (sliding layers keep
    only their window)."""
    total = 0
    for layer in model.layers:
        per_token = layer_kv_bytes_per_token(layer, model, dtype_bytes, tp)
        kept = tokens
        if layer.kind == "sliding" and layer.window is not None:
            kept = min(tokens, layer.window + block_size)
        total += math.ceil(kept / block_size) * block_size * per_token
    return total


def pool_bytes_for(
    model: ModelFacts, dtype_bytes: int, block: int, tp: int, tokens: int, requests: int
) -> int:
    """The GPU KV pool, in bytes, that holds ``requests`` requests of ``tokens`` each in
    whole blocks, plus the one block vLLM's pool holds back."""
    per_block = kv_bytes_per_token(model, dtype_bytes, tp) * block
    if per_block == 0:
        return 0
    per_request = -(-request_kv_bytes(model, dtype_bytes, tokens, block, tp) // per_block)
    return (requests * per_request + 1) * per_block


def longest_for(
    model: ModelFacts, dtype_bytes: int, block: int, tp: int, pool: int, requests: int, cap: int
) -> int:
    """The longest request (up to ``cap`` tokens) of which ``requests`` fit ``pool`` bytes;
    0 when not even one block each does."""
    low, high = 0, cap  # pool_bytes_for grows with tokens: bisect for the last that fits
    while low < high:
        mid = (low + high + 1) // 2
        if pool_bytes_for(model, dtype_bytes, block, tp, mid, requests) <= pool:
            low = mid
        else:
            high = mid - 1
    return low


def h2d_bytes_per_s(host: HostFacts) -> tuple[float, str]:
    """Host->GPU copy speed of registered memory on this host's link, and where it is from."""
    gpu = min(host.gpus, key=lambda g: (g.pcie_generation or 99, g.pcie_width or 99), default=None)
    gen, width = (gpu.pcie_generation, gpu.pcie_width) if gpu else (None, None)
    link = "read from NVML"
    if gen not in PCIE_GT_PER_S or not width:
        (gen, width), link = ASSUMED_PCIE, "assumed: no GPU here to ask"
    speed = H2D_GEN5_X16_BYTES_PER_S * PCIE_GT_PER_S[gen] / PCIE_GT_PER_S[5] * width / 16
    how = "measured on an H200" if (gen, width) == (5, 16) else "an H200's Gen5 x16 figure scaled"
    return speed, f"PCIe Gen{gen} x{width}, {link}; {how}"


@dataclass(frozen=True)
class Plan:
    platform: Platform
    model_path: str
    architecture: str
    kv_offload_backend: Literal["native", "lmcache", "none"]
    kv_offload_backend_reason: str
    block_size_tokens: int
    cpu_chunk_tokens: int  # tokens the CPU tier moves as one chunk (a multiple of the block)
    kv_cache_dtype: Literal["auto", "fp8"]  # resolved: 'fit' becomes one of these
    kv_dtype_bytes: int
    kv_bytes_per_token: int  # per rank, all layers
    kv_bytes_per_block: int  # per rank, all layers
    weight_bytes: int
    weight_bytes_source: str
    weights_gpu_bytes: int  # per rank
    weights_offloaded_bytes: int  # per rank (vLLM --cpu-offload-gb is per rank)
    # prefetch backend: every prefetch_group_size layers, the last prefetch_num_in_group
    # live in host RAM (vLLM's --offload-group-size / --offload-num-in-group); 0 otherwise.
    prefetch_group_size: int
    prefetch_num_in_group: int
    weights_offloaded_layers: int
    gpu_total_bytes: int
    gpu_budget_bytes: int
    gpu_kv_pool_bytes: int
    gpu_kv_pool_blocks: int
    gpu_kv_pool_tokens: int  # what vLLM logs as "KV cache size: N tokens"
    longest_request_tokens: int  # one request must fit the GPU pool (+ the host extension)
    model_max_tokens: int
    max_model_len: int
    max_model_len_source: Literal["configured", "auto"]
    max_concurrency_at_full_length: float
    min_concurrent_requests: int  # full-length requests the pool must hold (gpu.*)
    host_extension_bytes: int  # per GPU: host RAM continuing the GPU KV pool (patch 0006)
    host_extension_tokens: int
    spilled_decode_steps_per_s_ceiling: float | None  # a max_model_len request's, if it spills
    cpu_tier_bytes: int
    cpu_tier_blocks: int
    cpu_tier_tokens: int
    ram_total_bytes: int
    ram_available_bytes: int
    ram_reserve_bytes: int
    shm_free_bytes: int
    server_ram_bytes: int  # what vLLM's own processes are expected to hold
    cpu_tier_room_ram_bytes: int  # the largest tier the host RAM holds (see TierRoom)
    cpu_tier_room_shm_bytes: int  # the largest /dev/shm holds
    # The disk tier behind the CPU tier (0 bytes: none): its directory, the folder of this
    # model's files in it, and the free space it keeps on that filesystem.
    disk_tier_path: str
    disk_tier_root: str
    disk_tier_bytes: int
    disk_tier_tokens: int
    disk_reserve_bytes: int
    tensor_parallel_size: int
    # Weight offload's cost: each decode step moves every offloaded byte host->GPU.
    h2d_bytes_per_s: float
    h2d_source: str
    decode_steps_per_s_ceiling: float | None  # None: no weights offloaded
    decisions: list[str] = field(default_factory=list)  # what each 'auto' became, and why
    warnings: list[str] = field(default_factory=list)
    unplanned: list[str] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)  # field + message each

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def resolve_kv_backend(
    config: DeploymentConfig, host: HostFacts, platform: Platform
) -> tuple[Literal["native", "lmcache", "none"], str]:
    chosen = config.kv_offload.backend
    if chosen == "auto":
        if platform == "cuda" and host.has_nvidia_gpu:
            return "native", "auto: an NVIDIA GPU is present"
        return "none", "auto: no NVIDIA GPU, so no CPU KV tier"
    return chosen, "configured"


def ram_reserve(host: HostFacts) -> int:
    return max(RAM_RESERVE_BYTES, int(host.ram_total_bytes * RAM_RESERVE_FRACTION))


def server_ram_bytes(world_size: int) -> int:
    """Host RAM vLLM's own processes hold when its CPU-tier check runs."""
    return SERVER_RAM_BYTES + (world_size - 1) * SERVER_RAM_PER_EXTRA_RANK_BYTES


@dataclass(frozen=True)
class TierRoom:
    """The largest CPU tier this host holds, by RAM and by /dev/shm, in bytes: what patched
    vLLM will find when it checks the tier, once its own processes and the offloaded
    weights are in memory."""

    ram_bytes: int
    shm_bytes: int

    @property
    def bytes(self) -> int:
        return min(self.ram_bytes, self.shm_bytes)


def tier_room(host: HostFacts, reserve: int, weights_in_ram: int, world_size: int) -> TierRoom:
    ram = host.ram_available_bytes - reserve - weights_in_ram - server_ram_bytes(world_size)
    return TierRoom(max(0, ram), max(0, host.shm_free_bytes - SERVER_SHM_BYTES))


def gpu_overhead_bytes(model: ModelFacts) -> int:
    return GPU_OVERHEAD_BASE_BYTES + model.hidden_size * GPU_OVERHEAD_PER_HIDDEN_BYTES


def decoder_layer_bytes(model: ModelFacts, weight_bytes: int, dtype_bytes: int) -> int:
    """Weight bytes of one decoder layer: all weights less the embeddings (and an untied
    LM head), shared evenly; the unit the prefetch backend moves."""
    embeddings = model.vocab_size * model.hidden_size * dtype_bytes
    embeddings *= 1 if model.tie_word_embeddings else 2
    return max(1, (weight_bytes - embeddings) // max(1, model.num_layers))


def prefetch_layout(num_layers: int, layers_needed: int) -> tuple[int, int, int]:
    """(group size, layers offloaded per group, layers offloaded): the fewest layers that
    cover ``layers_needed``, in the smallest groups (spread evenly, so each copy has
    resident layers' compute to hide behind). vLLM offloads the last ``k`` of every ``g``."""
    best = (num_layers, num_layers, num_layers + 1)  # worse than any answer
    for group in range(1, num_layers + 1):
        for in_group in range(1, group + 1):
            # whole groups, then the partial last group's layers past group - in_group
            count = num_layers // group * in_group + max(0, num_layers % group - group + in_group)
            if layers_needed <= count < best[2]:
                best = (group, in_group, count)
    return best


@dataclass(frozen=True)
class GpuMemory:
    """Where the weights go and how big the GPU KV pool is, per rank."""

    total_bytes: int
    budget_bytes: int
    weights_offloaded_bytes: int
    weights_gpu_bytes: int
    kv_pool_bytes: int
    # prefetch backend: every group_size layers, the last num_in_group live in host RAM
    prefetch_group_size: int = 0
    prefetch_num_in_group: int = 0
    offloaded_layers: int = 0


@dataclass(frozen=True)
class GpuBudget:
    """One rank's GPU memory before the KV pool: what vLLM may use, its working memory,
    and the weights (whole decoder layers are what can be offloaded)."""

    total_bytes: int
    budget_bytes: int
    overhead_bytes: int  # without the prefetch backend's layer buffers
    weights_bytes: int
    layer_bytes: int
    layers: int  # decoder layers on this rank
    prefetch_buffer_bytes: int  # the prefetch backend's GPU buffers, when it offloads

    @property
    def offloadable_bytes(self) -> int:
        return min(self.weights_bytes, self.layer_bytes * self.layers)

    def largest_pool_bytes(self) -> int:
        """The KV pool left with every decoder layer's weights in host RAM."""
        return (self.budget_bytes - (self.weights_bytes - self.offloadable_bytes)
                - self.overhead_bytes - self.prefetch_buffer_bytes)  # fmt: skip


def gpu_budget(config: DeploymentConfig, model: ModelFacts, host: HostFacts,
               weight_bytes: int) -> GpuBudget:  # fmt: skip
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    if not host.gpus:
        raise PlanError("gpu", "no NVIDIA GPU found; plan for a card with --gpu-mem-gib N")
    total = min(g.total_bytes for g in host.gpus)
    # Tensor parallelism splits every layer; pipeline stages hold whole layers.
    layer = decoder_layer_bytes(model, weight_bytes, compute_dtype_bytes(model, config.model.dtype))
    layer //= tp
    prefetch = config.weights_offload.backend == "prefetch"
    return GpuBudget(
        total_bytes=total,
        budget_bytes=int(total * config.gpu.memory_utilization),
        overhead_bytes=gpu_overhead_bytes(model),
        weights_bytes=weight_bytes // (tp * pp),
        layer_bytes=layer,
        layers=max(1, model.num_layers // pp),
        # the GPU buffers offloaded layers are copied into
        prefetch_buffer_bytes=config.weights_offload.prefetch_step * layer if prefetch else 0,
    )


def plan_gpu_memory(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    env: dict[str, str],
    weight_bytes: int,
    dtype_b: int,
    block: int,
    target: tuple[int, int],
    decisions: list[str],
) -> GpuMemory:
    """Weights on the GPU or offloaded (as configured, or the fewest that leave a pool for
    ``target``: (tokens, requests)), then the KV pool from what is left (or as configured);
    raises PlanError when nothing is left. ``dtype_b``: bytes per KV element."""
    tp = config.parallel.tensor_parallel_size
    group_size = num_in_group = offloaded_layers = 0  # prefetch layout, when it applies
    if platform != "cuda":
        weights_per_rank = weight_bytes // (tp * config.parallel.pipeline_parallel_size)
        space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
        if space:
            pool = int(space) * GIB  # vLLM lets this variable override everything else
        elif config.gpu.kv_cache_memory_bytes != "auto":
            pool = config.gpu.kv_cache_memory_bytes
        else:
            pool = CPU_PLATFORM_DEFAULT_POOL_BYTES
        return GpuMemory(0, 0, 0, weights_per_rank, pool)
    gpu = gpu_budget(config, model, host, weight_bytes)
    fixed_pool = config.gpu.kv_cache_memory_bytes
    offload = config.weights_offload.cpu_gib
    if offload == "auto":
        tokens, requests = target
        room = (
            fixed_pool
            if fixed_pool != "auto"
            else pool_bytes_for(model, dtype_b, block, tp, tokens, requests)
        )
        need = gpu.weights_bytes + gpu.overhead_bytes + room - gpu.budget_bytes
        if need > 0:
            need += gpu.prefetch_buffer_bytes
        if need > gpu.offloadable_bytes:
            raise unreachable(config, model, host, weight_bytes, dtype_b, block, target, room)
        # rounded up to 0.1 GiB, the figure shown
        offloaded = min(int(math.ceil(need / GIB * 10) / 10 * GIB), gpu.offloadable_bytes)
        offloaded = max(0, offloaded)
    else:
        offloaded = min(int(offload * GIB), gpu.weights_bytes)
    overhead = gpu.overhead_bytes + (gpu.prefetch_buffer_bytes if offloaded else 0)
    if gpu.prefetch_buffer_bytes and offloaded > 0:
        needed = min(model.num_layers, math.ceil(offloaded / gpu.layer_bytes))
        group_size, num_in_group, offloaded_layers = prefetch_layout(model.num_layers, needed)
        offloaded = offloaded_layers * gpu.layer_bytes
    if offload == "auto":
        tokens, requests = target
        what = f"{_gib(offloaded)} per GPU" + (
            f" ({offloaded_layers} whole layers)" if offloaded_layers else ""
        )
        room_for = (
            f"the configured {_gib(fixed_pool)} GPU KV pool"
            if fixed_pool != "auto"
            else f"a GPU KV pool of {requests} x {tokens:,} tokens"
        )
        decisions.append(
            f"weights_offload.cpu_gib auto -> {what}: the fewest that leave room for {room_for}"
            if offloaded
            else f"weights_offload.cpu_gib auto -> 0: the weights fit with room for {room_for}"
        )
    weights_gpu = gpu.weights_bytes - offloaded
    pool = fixed_pool if fixed_pool != "auto" else gpu.budget_bytes - weights_gpu - overhead
    if pool <= 0:
        fix = (
            "set weights_offload.cpu_gib (or 'auto') to keep part of the weights in host RAM"
            if offloaded == 0
            else "offload more weights (weights_offload.cpu_gib) or raise gpu.memory_utilization"
        )
        raise PlanError(
            "weights_offload.cpu_gib",
            f"the weights ({gpu.weights_bytes / GIB:.2f} GiB per GPU) and vLLM's working "
            f"memory (~{overhead / GIB:.1f} GiB) do not fit in "
            f"{config.gpu.memory_utilization:.0%} of {gpu.total_bytes / GIB:.1f} GiB: {fix}",
        )
    return GpuMemory(gpu.total_bytes, gpu.budget_bytes, offloaded, weights_gpu, pool,
                     group_size, num_in_group, offloaded_layers)  # fmt: skip


def reachable_tokens(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    weight_bytes: int,
    dtype_b: int,
    block: int,
    requests: int,
) -> int:
    """The longest request of which ``requests`` fit the GPU pool left with every decoder
    layer's weights offloaded (capped at the model's limit)."""
    gpu = gpu_budget(config, model, host, weight_bytes)
    cap = model.max_position_embeddings or 1 << 24
    tp = config.parallel.tensor_parallel_size
    return longest_for(model, dtype_b, block, tp, gpu.largest_pool_bytes(), requests, cap)


def unreachable(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    weight_bytes: int,
    dtype_b: int,
    block: int,
    target: tuple[int, int],
    room: int,
) -> PlanError:
    """Why no weight offload reaches ``target``, the longest length that is reachable, and
    what else would reach further, each with its number."""
    tokens, requests = target
    gpu = gpu_budget(config, model, host, weight_bytes)
    if config.gpu.kv_cache_memory_bytes != "auto":
        return PlanError(
            "gpu.kv_cache_memory_bytes",
            f"a {_gib(room)} GPU KV pool does not fit even with every decoder layer's weights "
            f"in host RAM ({_gib(gpu.offloadable_bytes)} per GPU): set it <= "
            f"{max(0, gpu.largest_pool_bytes())} bytes, or 'auto'",
        )
    best = reachable_tokens(config, model, host, weight_bytes, dtype_b, block, requests)
    helps = []
    if dtype_b > 1:
        fp8 = reachable_tokens(config, model, host, weight_bytes, 1, block, requests)
        helps.append(f"model.kv_cache_dtype = 'fp8' ({fp8:,} tokens)")
    if config.gpu.memory_utilization < 0.95:
        roomier = config.model_copy(update={"gpu": config.gpu.model_copy(
            update={"memory_utilization": 0.95})})  # fmt: skip
        more = reachable_tokens(roomier, model, host, weight_bytes, dtype_b, block, requests)
        helps.append(f"gpu.memory_utilization = 0.95 ({more:,} tokens)")
    if host.gpus:
        tp = config.parallel.tensor_parallel_size * 2
        wider = config.model_copy(update={"parallel": config.parallel.model_copy(
            update={"tensor_parallel_size": tp})})  # fmt: skip
        twice = replace(host, gpus=tuple(replace(host.gpus[0], index=i) for i in range(tp)))
        more = reachable_tokens(wider, model, twice, weight_bytes, dtype_b, block, requests)
        helps.append(f"{tp} GPUs (parallel.tensor_parallel_size = {tp}: {more:,} tokens)")
    field_name = "model.max_model_len" if config.model.max_model_len != "auto" else "gpu"
    limit = f"set model.max_model_len <= {best:,}" if best > 0 else "no request length fits at all"
    return PlanError(
        field_name,
        f"{requests} request(s) of {tokens:,} tokens need a {_gib(room)} GPU KV pool, but "
        f"even with every decoder layer's weights in host RAM "
        f"({_gib(gpu.offloadable_bytes)} per GPU) the pool is "
        f"{_gib(max(0, gpu.largest_pool_bytes()))}: {limit}"
        + (f" (gpu.min_concurrent_requests = {requests})" if requests > 1 else "")
        + ". What else would reach further: "
        + "; ".join(helps or ["a GPU with more memory"]),
    )


def cpu_tier_bytes(
    config: DeploymentConfig,
    backend: str,
    room: TierRoom,
    per_token: int,
    block: int,
    warnings: list[str],
) -> int:
    """The CPU tier, all ranks together: none, as configured (the seed's num_cpu_blocks
    translated, with a warning), or (auto) the room the host has, in whole GiB."""
    tp = config.parallel.tensor_parallel_size
    if backend == "none":
        return 0
    if (legacy_blocks := config.kv_offload.num_cpu_blocks) is not None:
        # The seed counted blocks of its block size: vLLM's 16 tokens unless configured.
        legacy_block = block if config.kv_offload.block_size != "auto" else 16
        tier = legacy_blocks * per_token * legacy_block * tp
        warnings.append(
            f"kv_offload.num_cpu_blocks is deprecated: {legacy_blocks} blocks = "
            f"{tier / GIB:.2f} GiB; set kv_offload.cpu_tier_gib = {tier / GIB:.2f} instead"
        )
        return tier
    if config.kv_offload.cpu_tier_gib == "auto":
        return room.bytes // GIB * GIB  # whole GiB: easy to read, easy to repeat
    return int(config.kv_offload.cpu_tier_gib * GIB)


def without_hybrid_manager(model: ModelFacts) -> ModelFacts:
    """The model as vLLM plans it when its hybrid KV cache manager is off: sliding-window
    layers keep every token, like full attention."""
    layers = tuple(
        replace(layer, kind="full", window=None) if layer.kind == "sliding" else layer
        for layer in model.layers
    )
    return replace(model, layers=layers)


def host_extension_bytes(
    config: DeploymentConfig, model: ModelFacts, platform: Platform, problems: list[dict[str, str]]
) -> int:
    """kv_offload.host_extension_gib in bytes, if this model and platform can have it."""
    extension = int(config.kv_offload.host_extension_gib * GIB)
    if not extension:
        return 0
    if platform != "cuda":
        problems.append({
            "field": "kv_offload.host_extension_gib",
            "message": "the host extension maps host RAM into the GPU's KV pool, which needs "
            "an NVIDIA GPU; set it to 0",
        })  # fmt: skip
    other = sorted({layer.kind for layer in model.layers} - {"full"})
    if other:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"the host extension places models whose layers are all full attention; "
            f"{model.architecture} also has {', '.join(other)} layers: set it to 0",
        )
    return extension


def runs_bfloat16(config: DeploymentConfig, model: ModelFacts) -> bool:
    """Whether vLLM computes in bfloat16: asked for, or 'auto' on a checkpoint that is
    neither float16 nor float32 (vLLM keeps bfloat16 and downcasts float32 to it)."""
    if config.model.dtype != "auto":
        return config.model.dtype == "bfloat16"
    return model.torch_dtype not in ("float16", "half")


def combination_checks(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    env: dict[str, str],
    backend: str,
    problems: list[dict[str, str]],
    warnings: list[str],
) -> None:
    """Combinations known to fail or to run badly with vLLM 0.32, each refused (a problem)
    or warned about with where it comes from upstream."""
    if platform == "cpu" and host.amx == "refused" and runs_bfloat16(config, model):
        problems.append({
            "field": "model.dtype",
            "message": f"{host.amx_detail}: vLLM's CPU attention runs AMX kernels in bfloat16 "
            "on such a CPU (v1/attention/backends/cpu_attn.py _get_attn_isa), and its worker "
            "would die with SIGILL on the first request; set model.dtype = 'float16' (vLLM's "
            "AVX-512 kernels), or give the machine a kernel that grants AMX (Linux 5.16+, AMX "
            "enabled for the VM)",
        })  # fmt: skip
    if backend != "none" and "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        problems.append({
            "field": "PYTORCH_CUDA_ALLOC_CONF",
            "message": "vLLM refuses a KV connector (the CPU tier) with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (config/vllm.py "
            "_verify_kv_transfer_compat, vllm-project/vllm#41237, #42404): remove it from the "
            "server's environment (the unit's EnvironmentFile) or set kv_offload.backend = none",
        })  # fmt: skip
    if backend == "lmcache" and any(layer.kind == "linear" for layer in model.layers):
        problems.append({
            "field": "kv_offload.backend",
            "message": "LMCache's connector does not support vLLM's hybrid KV cache manager, so "
            "vLLM turns it off, and a model with linear-attention (Mamba) layers then fails to "
            "start ('Failed to promote local KV cache specs', vllm-project/vllm#42911); use "
            "kv_offload.backend = native, which keeps it",
        })  # fmt: skip
    if backend == "lmcache" and any(layer.kind == "sliding" for layer in model.layers):
        warnings.append(
            "with LMCache vLLM turns its hybrid KV cache manager off, so sliding-window layers "
            "keep every token (planned so here; vllm-project/vllm#41847); the native tier "
            "keeps the window"
        )
    drafting = any(flag_name(token) == "--speculative-config" for token in config.extra_args)
    if backend == "native" and drafting:
        warnings.append(
            "with a speculative drafter (EAGLE, MTP) the native tier leaves each prompt's "
            "last chunk out of storing and of hits (vLLM 0.32 offloading/scheduler.py, after "
            "vllm-project/vllm#46971 and #52735): up to kv_offload.cpu_chunk_tokens fewer "
            "tokens served per hit"
        )
    if host.wsl and env.get("VLLM_WSL2_ENABLE_PIN_MEMORY", "0") == "1":
        warnings.append(
            "WSL2: pinned memory is on (VLLM_WSL2_ENABLE_PIN_MEMORY=1); Windows caps it at "
            "about half the RAM given to WSL, so keep the CPU tier and offloaded weights below"
        )
    elif host.wsl:
        warnings.append(
            "WSL2: vLLM turns pinned memory off here unless VLLM_WSL2_ENABLE_PIN_MEMORY=1 (its "
            "platforms/cuda.py), so the CPU tier and weight offload copy from pageable "
            "memory, several times slower; set it in the server's environment"
        )


@dataclass(frozen=True)
class DiskTier:
    root: str
    bytes: int
    reserve_bytes: int


def plan_disk_tier(
    config: DeploymentConfig,
    model: ModelFacts,
    disk: DiskFacts | None,
    backend: str,
    request_bytes: int,
    decisions: list[str],
    warnings: list[str],
    problems: list[dict[str, str]],
) -> DiskTier:
    """The disk tier as configured, or no disk tier (with a problem saying why not)."""
    path = config.kv_offload.disk_path
    if not path:
        return DiskTier("", 0, 0)

    def refuse(field_name: str, message: str) -> DiskTier:
        problems.append({"field": field_name, "message": message})
        return DiskTier("", 0, 0)

    if backend != "native":
        return refuse("kv_offload.disk_path", "the disk tier sits behind vLLM's native CPU "
                      "tier: set kv_offload.backend = native, or disk_path = ''")  # fmt: skip
    if config.kv_offload.store_threshold >= 2:
        return refuse("kv_offload.store_threshold", "vLLM's tiering (the disk tier) does not "
                      "take a store threshold (tiering/spec.py refuses it): set it to 0, "
                      "or disk_path = ''")  # fmt: skip
    if os.path.realpath(path) == "/":
        return refuse("kv_offload.disk_path", "not the root directory: give the disk tier a "
                      "directory of its own (e.g. /nvme/vllm-kv)")  # fmt: skip
    if disk is None or not disk.exists:
        return refuse("kv_offload.disk_path", f"{path} does not exist; create it (`mkdir -p "
                      f"{path}`, writable by the server's user) or set disk_path = ''")  # fmt: skip
    if not disk.writable:
        return refuse("kv_offload.disk_path", f"{path} is not writable here; give the server's "
                      "user write access (chown/chmod) or choose another directory")  # fmt: skip
    if disk.filesystem in RAM_FILESYSTEMS:
        return refuse("kv_offload.disk_path", f"{path} is on {disk.filesystem}, which is "
                      "RAM (the CPU tier's); choose a directory on a disk (NVMe)")  # fmt: skip
    reserve = max(DISK_RESERVE_BYTES, int(disk.total_bytes * DISK_RESERVE_FRACTION))
    room = max(0, disk.total_bytes - reserve)
    if config.kv_offload.disk_gib == "auto":
        size = int(room * DISK_AUTO_SHARE) // GIB * GIB
        decisions.append(
            f"kv_offload.disk_gib auto -> {size // GIB}: half of {path}'s "
            f"{_gib(disk.total_bytes)} less the {_gib(reserve)} it always keeps free"
        )
    else:
        size = int(config.kv_offload.disk_gib * GIB)
        if size > room:
            return refuse("kv_offload.disk_gib", f"{path} is a {_gib(disk.total_bytes)} "
                          f"filesystem and keeps {_gib(reserve)} free: set disk_gib <= "
                          f"{room // GIB}")  # fmt: skip
    if size < request_bytes:
        return refuse("kv_offload.disk_gib", f"a {_gib(size)} disk tier holds less than one "
                      f"full-length request ({_gib(request_bytes)}); give it more, or set "
                      "disk_path = ''")  # fmt: skip
    if disk.filesystem in NETWORK_FILESYSTEMS:
        warnings.append(
            f"the disk tier {path} is on {disk.filesystem}, a network filesystem: every KV "
            "read is a round trip; a local NVMe directory is much faster"
        )
    if disk.o_direct is False:
        warnings.append(
            f"{path} does not take O_DIRECT: vLLM's disk tier falls back to buffered I/O, "
            "and its reads and writes go through the page cache (RAM the CPU tier needs)"
        )
    # Each model's files under its own folder: changed weights at the same path (a new
    # fingerprint) never find another model's KV.
    return DiskTier(str(disk_layout.tier_root(path) / model.fingerprint), size, reserve)


def fit_kv_cache_dtype(
    config: DeploymentConfig, model: ModelFacts, host: HostFacts, platform: Platform,
    env: dict[str, str],
) -> tuple[Literal["auto", "fp8"], str]:  # fmt: skip
    """model.kv_cache_dtype = 'fit': the model's dtype unless it cannot hold the target
    (max_model_len x min_concurrent_requests) without offloading more weights; then fp8."""
    if platform != "cuda":
        return "auto", "the model's dtype (fp8 KV needs an NVIDIA GPU)"
    if config.model.max_model_len == "auto":
        return "auto", "the model's dtype (no length to reach: model.max_model_len is auto)"
    as_model = config.model_copy(update={"model": config.model.model_copy(
        update={"kv_cache_dtype": "auto"})})  # fmt: skip
    target = f"{config.gpu.min_concurrent_requests} x {config.model.max_model_len:,} tokens"
    try:
        fitted = make_plan(as_model, model, host, platform, env)
    except PlanError:
        return "fp8", f"at the model's dtype {target} do not fit the GPU"
    if config.weights_offload.cpu_gib != "auto":
        return "auto", f"{target} fit at the model's dtype"
    without_target = as_model.model_copy(update={
        "model": as_model.model.model_copy(update={"max_model_len": "auto"}),
        "gpu": as_model.gpu.model_copy(update={"min_concurrent_requests": 1}),
    })  # fmt: skip
    try:
        base = make_plan(without_target, model, host, platform, env).weights_offloaded_bytes
    except PlanError:  # even a short request needs offloading past what fits: no baseline
        base = 0
    if fitted.weights_offloaded_bytes > base:
        return "fp8", (
            f"at the model's dtype {target} need {_gib(fitted.weights_offloaded_bytes)} of "
            f"weights offloaded, {_gib(base)} without them"
        )
    return "auto", f"{target} fit at the model's dtype without offloading more weights"


def make_plan(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    env: dict[str, str] | None = None,
    disk: DiskFacts | None = None,
) -> Plan:
    """Resolve every 'auto' of ``config`` into numbers, or raise PlanError."""
    env = env or {}
    warnings: list[str] = [f"could not read {what}" for what in model.unknown]
    decisions: list[str] = []
    tp = config.parallel.tensor_parallel_size
    pp = config.parallel.pipeline_parallel_size
    backend, backend_reason = resolve_kv_backend(config, host, platform)
    if config.kv_offload.backend == "auto":
        decisions.append(f"kv_offload.backend {backend_reason.replace(': ', f' -> {backend}: ')}")
    # Found while planning, but the plan is still worth showing (`serve --dry-run` prints
    # a GPU host's command anywhere): a deployment refuses to start while any is left.
    problems: list[dict[str, str]] = []
    if backend != "none" and platform != "cuda":
        problems.append({
            "field": "kv_offload.backend",
            "message": "CPU KV offload needs an NVIDIA GPU; set kv_offload.backend = none",
        })  # fmt: skip
    as_read = model
    if backend == "lmcache":
        model = without_hybrid_manager(model)
    block = config.kv_offload.block_size
    if block == "auto":
        plain_attention = all(layer.kind in ("full", "sliding") for layer in model.layers)
        if backend == "native" and plain_attention:
            block, why = OFFLOAD_BLOCK_SIZE, "bigger host<->GPU copies for the native tier"
        else:
            block = DEFAULT_BLOCK_SIZE[platform]
            why = "vLLM's default" if platform == "cuda" else "the CPU backend's (a multiple of 32)"
        decisions.append(f"kv_offload.block_size auto -> {block}: {why}")
    kv_cache_dtype = config.model.kv_cache_dtype
    if kv_cache_dtype == "fit":
        kv_cache_dtype, why = fit_kv_cache_dtype(config, model, host, platform, env)
        decisions.append(f"model.kv_cache_dtype fit -> {kv_cache_dtype}: {why}")
    dtype_b = kv_dtype_bytes(model, config.model.dtype, kv_cache_dtype)
    per_token = kv_bytes_per_token(model, dtype_b, tp)
    per_block = per_token * block
    configured_chunk = config.kv_offload.cpu_chunk_tokens
    if configured_chunk == "auto":
        chunk = max(OFFLOAD_CHUNK_TOKENS, block) if backend == "native" else block
    elif configured_chunk % block:
        raise PlanError(
            "kv_offload.cpu_chunk_tokens",
            f"{configured_chunk} is not a multiple of the block size ({block} tokens); use "
            f"{-(-configured_chunk // block) * block}",
        )
    else:
        chunk = configured_chunk

    # The checkpoint's bytes at the dtype vLLM runs it in (a float32 checkpoint is served in
    # 16 bits); quantised weights stay as stored.
    weight_bytes = (
        int(model.weight_bytes * compute_dtype_bytes(model, config.model.dtype) / model.dtype_bytes)
        if model.quantization is None
        else model.weight_bytes
    )
    requests = config.gpu.min_concurrent_requests
    model_limit = model.max_position_embeddings
    target_tokens = (
        config.model.max_model_len
        if config.model.max_model_len != "auto"
        else min(model_limit or AUTO_OFFLOAD_ROOM_TOKENS, AUTO_OFFLOAD_ROOM_TOKENS)
    )
    gpu = plan_gpu_memory(config, model, host, platform, env, weight_bytes, dtype_b, block,
                          (target_tokens, requests), decisions)  # fmt: skip
    pool, offloaded = gpu.kv_pool_bytes, gpu.weights_offloaded_bytes
    extension = host_extension_bytes(config, model, platform, problems)
    num_blocks = pool // per_block if per_block else 0
    extension_blocks = 0
    if extension and per_block:
        # As patch 0006 counts them: both parts in whole multiples of the blocks that keep
        # each GPU/host boundary on a 2 MiB mapping granule in every layer's region.
        page = per_block // len(model.layers)
        step = HOST_MAP_GRANULE // math.gcd(HOST_MAP_GRANULE, page)
        num_blocks = num_blocks // step * step
        extension_blocks = extension // per_block // step * step
    # what one request, and several at once, may use
    kv_pool = (num_blocks + extension_blocks) * per_block if extension else pool
    usable_blocks = max(0, num_blocks - 1)  # vLLM's block pool holds one null block back
    # Sliding-window layers keep only their window, so one request may run past the blocks
    # a full-attention model could give it (up to the model's limit).
    configured_len = config.model.max_model_len if config.model.max_model_len != "auto" else 0
    extended_tokens = (usable_blocks + extension_blocks) * block
    longest = longest_for(model, dtype_b, block, tp, kv_pool, 1,
                          max(extended_tokens, model_limit or 0, configured_len))  # fmt: skip
    model_max = model_limit or longest

    if config.model.max_model_len == "auto":
        max_len = (
            min(model_max, longest)
            if requests == 1
            else longest_for(model, dtype_b, block, tp, kv_pool, requests, model_max)
        )
        len_source: Literal["configured", "auto"] = "auto"
        pool_name = "GPU KV pool and host extension" if extension else "GPU KV pool"
        if max_len <= 0:
            raise PlanError(
                "gpu.kv_cache_memory_bytes",
                f"the GPU KV pool ({pool / GIB:.2f} GiB) holds no whole block of "
                f"{block} tokens ({per_block} bytes) for each of {requests} request(s); give "
                "the pool more memory",
            )
        held = "one request" if requests == 1 else f"{requests} requests at once"
        decisions.append(
            f"model.max_model_len auto -> {max_len:,}: "
            + (
                "the model's limit"
                if max_len == model_max
                else f"the longest the {pool_name} {'hold' if extension else 'holds'} for {held}"
            )
        )
    else:
        max_len = config.model.max_model_len
        len_source = "configured"
        offload_hint = (
            "; or set weights_offload.cpu_gib = 'auto' to offload the weights that make room"
            if platform == "cuda" and config.weights_offload.cpu_gib != "auto"
            else ""
        )
        if max_len > longest:
            where = (
                "GPU KV pool and its host extension, which hold"
                if extension
                else "GPU KV pool, which holds"
            )
            raise PlanError(
                "model.max_model_len",
                f"{max_len} tokens do not fit the {where} {longest} tokens for one request. "
                f"The CPU tier does not extend one request (vLLM keeps a request's whole KV "
                f"in its pool); set model.max_model_len <= {longest} or 'auto'{offload_hint}"
                + (
                    "; or give kv_offload.host_extension_gib the rest (host RAM that continues "
                    "the pool: a request that reaches it runs slower)"
                    if platform == "cuda" and all(layer.kind == "full" for layer in model.layers)
                    else ""
                ),
            )
        if pool_bytes_for(model, dtype_b, block, tp, max_len, requests) > kv_pool:
            reach = longest_for(model, dtype_b, block, tp, kv_pool, requests, max_len)
            request_blocks = -(-request_kv_bytes(model, dtype_b, max_len, block, tp) // per_block)
            raise PlanError(
                "gpu.min_concurrent_requests",
                f"the GPU KV pool holds "
                f"{(usable_blocks + extension_blocks) // request_blocks} request(s) of "
                f"{max_len} tokens at once, not {requests}: lower it, or model.max_model_len "
                f"to {reach}{offload_hint}",
            )
        if model.max_position_embeddings and max_len > model.max_position_embeddings:
            warnings.append(
                f"max_model_len {max_len} exceeds the model's limit "
                f"({model.max_position_embeddings}); vLLM will refuse it"
            )
    blocks_per_request = (
        request_kv_bytes(model, dtype_b, max_len, block, tp) // per_block if per_block else 1
    )
    concurrency = num_blocks / blocks_per_request if blocks_per_request else 0.0
    pool_tokens = int(concurrency * max_len)
    concurrency += extension_blocks / blocks_per_request if blocks_per_request else 0.0

    # --- CPU tier -------------------------------------------------------------------
    reserve = ram_reserve(host)
    ram_left = tier_room(host, reserve, offloaded * tp * pp, tp * pp).ram_bytes
    if extension * tp * pp > ram_left:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"{_gib(extension)} per GPU{f' x {tp * pp} GPUs' if tp * pp > 1 else ''} do "
            f"not fit the host RAM left: "
            f"{_gib(ram_left)} after the reserve, vLLM and offloaded weights; set it <= "
            f"{ram_left // (tp * pp) // GIB}",
        )
    room = tier_room(host, reserve, (offloaded + extension) * tp * pp, tp * pp)
    tier = cpu_tier_bytes(config, backend, room, per_token, block, warnings)
    tier_blocks = tier // (per_block * tp) if per_block else 0
    tier_tokens = tier_blocks * block
    if backend != "none" and config.kv_offload.cpu_tier_gib == "auto":
        bound = "host RAM" if room.ram_bytes <= room.shm_bytes else "/dev/shm"
        decisions.append(
            f"kv_offload.cpu_tier_gib auto -> {tier // GIB}: the room {bound} leaves (RAM "
            f"{_gib(room.ram_bytes)} after reserve, vLLM and offloaded weights; /dev/shm "
            f"{_gib(room.shm_bytes)}), whole GiB"
        )

    request_bytes = request_kv_bytes(model, dtype_b, max_len, block, tp) * tp
    disk_tier = plan_disk_tier(config, model, disk, backend, request_bytes, decisions, warnings,
                               problems)  # fmt: skip

    if backend != "none" and tier_tokens < max_len:
        warnings.append(
            f"the CPU tier ({tier_tokens} tokens) is smaller than one full-length "
            f"request ({max_len} tokens)"
        )
    if concurrency < 2 and not extension:
        warnings.append(
            f"the GPU pool holds {concurrency:.2f} requests of {max_len} tokens; "
            "long requests will queue one at a time"
        )

    # Not checked: the memlock limit. cudaHostRegister ignores it (an H200 host registered
    # 4 GiB at full speed under an 8 MiB limit without CAP_IPC_LOCK: benchmarks/results/
    # h200-vllm-0.32.0/host-checks/), so refusing a tier for it would refuse what works.
    combination_checks(config, as_read, host, platform, env, backend, problems, warnings)

    # --- what weight offload costs ---------------------------------------------------
    speed, speed_source = h2d_bytes_per_s(host) if platform == "cuda" else (0.0, "no GPU")
    ceiling = speed / offloaded if offloaded and speed else None
    gpu_part = num_blocks * per_block if extension else pool  # as aligned for the extension
    spilled = max(0, request_kv_bytes(model, dtype_b, max_len, block, tp) - gpu_part)
    spilled_ceiling = speed / spilled if extension and spilled and speed else None
    if extension:
        decisions.append(
            f"host extension: {_gib(extension)} per GPU = "
            f"{extension_blocks * block:,} tokens of KV in host RAM "
            "after the GPU pool, used once the GPU's blocks are taken; "
            + (
                f"a {max_len:,}-token request puts {_gib(spilled)} there, which every decode "
                f"step reads over PCIe at ~{speed / 1e9:.1f} GB/s ({speed_source}): at most "
                f"{spilled_ceiling:.1f} tokens/s for it; its prefill reads it many times over"
                if spilled_ceiling is not None
                else "no request of max_model_len tokens reaches it alone"
            )
        )
    if ceiling is not None:
        decisions.append(
            f"decode speed cost: each step moves {_gib(offloaded)} of weights host->GPU at "
            f"~{speed / 1e9:.1f} GB/s ({speed_source}): at most {ceiling:.1f} steps/s, "
            "i.e. tokens/s per request"
        )

    return Plan(
        platform=platform,
        model_path=model.path,
        architecture=model.architecture,
        kv_offload_backend=backend,
        kv_offload_backend_reason=backend_reason,
        block_size_tokens=block,
        cpu_chunk_tokens=chunk,
        kv_cache_dtype=kv_cache_dtype,
        kv_dtype_bytes=dtype_b,
        kv_bytes_per_token=per_token,
        kv_bytes_per_block=per_block,
        weight_bytes=weight_bytes,
        weight_bytes_source=model.weight_bytes_source,
        weights_gpu_bytes=gpu.weights_gpu_bytes,
        weights_offloaded_bytes=offloaded,
        prefetch_group_size=gpu.prefetch_group_size,
        prefetch_num_in_group=gpu.prefetch_num_in_group,
        weights_offloaded_layers=gpu.offloaded_layers,
        gpu_total_bytes=gpu.total_bytes,
        gpu_budget_bytes=gpu.budget_bytes,
        gpu_kv_pool_bytes=pool,
        gpu_kv_pool_blocks=num_blocks,
        gpu_kv_pool_tokens=pool_tokens,
        longest_request_tokens=longest,
        model_max_tokens=model_max,
        max_model_len=max_len,
        max_model_len_source=len_source,
        max_concurrency_at_full_length=round(concurrency, 2),
        min_concurrent_requests=requests,
        host_extension_bytes=extension,
        host_extension_tokens=extension_blocks * block,
        spilled_decode_steps_per_s_ceiling=(
            None if spilled_ceiling is None else round(spilled_ceiling, 2)
        ),
        cpu_tier_bytes=tier,
        cpu_tier_blocks=tier_blocks,
        cpu_tier_tokens=tier_tokens,
        ram_total_bytes=host.ram_total_bytes,
        ram_available_bytes=host.ram_available_bytes,
        ram_reserve_bytes=reserve,
        shm_free_bytes=host.shm_free_bytes,
        server_ram_bytes=server_ram_bytes(tp * pp),
        cpu_tier_room_ram_bytes=room.ram_bytes,
        cpu_tier_room_shm_bytes=room.shm_bytes,
        disk_tier_path=config.kv_offload.disk_path if disk_tier.bytes else "",
        disk_tier_root=disk_tier.root,
        disk_tier_bytes=disk_tier.bytes,
        disk_tier_tokens=disk_tier.bytes // (per_token * tp) // block * block if per_token else 0,
        disk_reserve_bytes=disk_tier.reserve_bytes,
        tensor_parallel_size=tp,
        h2d_bytes_per_s=speed,
        h2d_source=speed_source,
        decode_steps_per_s_ceiling=None if ceiling is None else round(ceiling, 2),
        decisions=decisions,
        warnings=warnings,
        unplanned=list(model.unknown),
        problems=problems,
    )


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def render(plan: Plan) -> str:
    """The short human table: what goes where, and how long one request can be."""
    rows = [
        ("model", f"{plan.architecture} at {plan.model_path}"),
        ("platform", plan.platform),
        ("weights", f"{_gib(plan.weight_bytes)} ({plan.weight_bytes_source})"),
        (
            "  on GPU / offloaded",
            f"{_gib(plan.weights_gpu_bytes)} / {_gib(plan.weights_offloaded_bytes)} per GPU"
            + (
                f" ({plan.weights_offloaded_layers} layers: the last {plan.prefetch_num_in_group}"
                f" of every {plan.prefetch_group_size}, prefetched)"
                if plan.weights_offloaded_layers
                else ""
            ),
        ),
        ("KV per token", f"{plan.kv_bytes_per_token:,} bytes"),
        ("KV per block", f"{plan.kv_bytes_per_block:,} bytes ({plan.block_size_tokens} tokens)"),
        (
            "GPU KV pool",
            f"{_gib(plan.gpu_kv_pool_bytes)} = {plan.gpu_kv_pool_blocks:,} blocks "
            f"= {plan.gpu_kv_pool_tokens:,} tokens",
        ),
        (
            "longest request",
            f"{plan.longest_request_tokens:,} tokens "
            + (
                "(GPU pool + host extension)"
                if plan.host_extension_bytes
                else "(must fit the GPU pool)"
            ),
        ),
        (
            "max_model_len",
            f"{plan.max_model_len:,} tokens ({plan.max_model_len_source}; "
            f"model limit {plan.model_max_tokens:,})",
        ),
        (
            "concurrency",
            f"{plan.max_concurrency_at_full_length:.2f} requests at full length"
            + (
                f" (at least {plan.min_concurrent_requests} asked)"
                if plan.min_concurrent_requests > 1
                else ""
            ),
        ),
        ("KV cache dtype", f"{plan.kv_cache_dtype} ({plan.kv_dtype_bytes} bytes per element)"),
        (
            "host extension",
            f"{_gib(plan.host_extension_bytes)} = {plan.host_extension_tokens:,} tokens per GPU "
            "(continues the pool in host RAM; slower)"
            if plan.host_extension_bytes
            else "none (kv_offload.host_extension_gib = 0)",
        ),
        ("CPU KV tier", f"{plan.kv_offload_backend} ({plan.kv_offload_backend_reason})"),
        (
            "  size",
            f"{_gib(plan.cpu_tier_bytes)} = {plan.cpu_tier_blocks:,} blocks = "
            f"{plan.cpu_tier_tokens:,} tokens (for reuse and preemption)",
        ),
        (
            "host RAM",
            f"{_gib(plan.ram_available_bytes)} available of "
            f"{_gib(plan.ram_total_bytes)}, reserve {_gib(plan.ram_reserve_bytes)}, "
            f"vLLM itself ~{_gib(plan.server_ram_bytes)}",
        ),
        ("/dev/shm free", _gib(plan.shm_free_bytes)),
    ]
    if plan.disk_tier_bytes:
        rows.append((
            "disk KV tier",
            f"{_gib(plan.disk_tier_bytes)} = {plan.disk_tier_tokens:,} tokens at "
            f"{plan.disk_tier_path}, keeping {_gib(plan.disk_reserve_bytes)} free (survives "
            "restarts)",
        ))  # fmt: skip
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"chose: {d}" for d in plan.decisions]
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += [f"cannot start: {p['field']}: {p['message']}" for p in plan.problems]
    return "\n".join(lines)
