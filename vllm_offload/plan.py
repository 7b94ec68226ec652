"""The planner: (config, model facts, host facts) -> Plan. Pure; no I/O.

The rule it never bends: one request's KV must fit the GPU pool, because vLLM
never streams a request's blocks during attention. The CPU tier holds blocks
for *reuse* (prefix hits) and preemption; it does not make one request longer.
Every figure carries its unit in its name.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import FieldError
from vllm_offload.hardware import GIB, HostFacts
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


@dataclass(frozen=True)
class Plan:
    platform: Platform
    model_path: str
    architecture: str
    kv_offload_backend: Literal["native", "lmcache", "none"]
    kv_offload_backend_reason: str
    block_size_tokens: int
    cpu_chunk_tokens: int  # tokens the CPU tier moves as one chunk (a multiple of the block)
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
    longest_request_tokens: int  # one request must fit the GPU pool
    model_max_tokens: int
    max_model_len: int
    max_model_len_source: Literal["configured", "auto"]
    max_concurrency_at_full_length: float
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
    tensor_parallel_size: int
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


def plan_gpu_memory(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    env: dict[str, str],
    weight_bytes: int,
    dtype_b: int,
    block: int,
) -> GpuMemory:
    """Weights on the GPU or offloaded (as configured, or what does not fit), then the KV
    pool from what is left (or as configured); raises PlanError when nothing is left.
    ``dtype_b``: bytes per KV element."""
    tp = config.parallel.tensor_parallel_size
    weights_per_rank = weight_bytes // (tp * config.parallel.pipeline_parallel_size)
    group_size = num_in_group = offloaded_layers = 0  # prefetch layout, when it applies
    if platform == "cuda":
        if not host.gpus:
            raise PlanError(
                "gpu",
                "no NVIDIA GPU found; plan for a card with --gpu-mem-gib N",
            )
        gpu_total = min(g.total_bytes for g in host.gpus)
        budget = int(gpu_total * config.gpu.memory_utilization)
        overhead = gpu_overhead_bytes(model)
        offload = config.weights_offload.cpu_gib
        prefetch = config.weights_offload.backend == "prefetch" and offload != 0.0
        # Tensor parallelism splits every layer; pipeline stages hold whole layers.
        layer_bytes = (
            decoder_layer_bytes(model, weight_bytes, compute_dtype_bytes(model, config.model.dtype))
            // tp
        )
        if prefetch:  # the GPU buffers offloaded layers are copied into
            overhead += config.weights_offload.prefetch_step * layer_bytes
        if offload == "auto":
            # Offload what does not fit, leaving room for one 4,096-token request (or one
            # at the model's limit, if shorter); rounded up to 0.1 GiB, the figure shown.
            room_for_kv = request_kv_bytes(
                model, dtype_b, min(model.max_position_embeddings or 4096, 4096), block, tp
            )
            need = weights_per_rank + overhead + room_for_kv - budget
            offloaded = int(math.ceil(need / GIB * 10) / 10 * GIB) if need > 0 else 0
        else:
            offloaded = min(int(offload * GIB), weights_per_rank)
        if prefetch and offloaded > 0:
            needed = min(model.num_layers, math.ceil(offloaded / layer_bytes))
            group_size, num_in_group, offloaded_layers = prefetch_layout(model.num_layers, needed)
            offloaded = offloaded_layers * layer_bytes
        weights_gpu = weights_per_rank - offloaded
        if config.gpu.kv_cache_memory_bytes != "auto":
            pool = config.gpu.kv_cache_memory_bytes
        else:
            pool = budget - weights_gpu - overhead
        if pool <= 0:
            fix = (
                "set weights_offload.cpu_gib (or 'auto') to keep part of the weights in host RAM"
                if offloaded == 0
                else "offload more weights (weights_offload.cpu_gib) or raise "
                "gpu.memory_utilization"
            )
            raise PlanError(
                "weights_offload.cpu_gib",
                f"the weights ({weights_per_rank / GIB:.2f} GiB per GPU) and vLLM's working "
                f"memory (~{overhead / GIB:.1f} GiB) do not fit in "
                f"{config.gpu.memory_utilization:.0%} of {gpu_total / GIB:.1f} GiB: {fix}",
            )
        return GpuMemory(gpu_total, budget, offloaded, weights_gpu, pool, group_size,
                         num_in_group, offloaded_layers)  # fmt: skip
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if space:
        pool = int(space) * GIB  # vLLM lets this variable override everything else
    elif config.gpu.kv_cache_memory_bytes != "auto":
        pool = config.gpu.kv_cache_memory_bytes
    else:
        pool = CPU_PLATFORM_DEFAULT_POOL_BYTES
    return GpuMemory(0, 0, 0, weights_per_rank, pool)


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


def make_plan(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    env: dict[str, str] | None = None,
) -> Plan:
    """Resolve every 'auto' of ``config`` into numbers, or raise PlanError."""
    env = env or {}
    warnings: list[str] = [f"could not read {what}" for what in model.unknown]
    tp = config.parallel.tensor_parallel_size
    pp = config.parallel.pipeline_parallel_size
    backend, backend_reason = resolve_kv_backend(config, host, platform)
    # Found while planning, but the plan is still worth showing (`serve --dry-run` prints
    # a GPU host's command anywhere): a deployment refuses to start while any is left.
    problems: list[dict[str, str]] = []
    if backend != "none" and platform != "cuda":
        problems.append({
            "field": "kv_offload.backend",
            "message": "CPU KV offload needs an NVIDIA GPU; set kv_offload.backend = none",
        })  # fmt: skip
    block = config.kv_offload.block_size
    if block == "auto":
        plain_attention = all(layer.kind in ("full", "sliding") for layer in model.layers)
        block = (
            OFFLOAD_BLOCK_SIZE
            if backend == "native" and plain_attention
            else DEFAULT_BLOCK_SIZE[platform]
        )
    dtype_b = kv_dtype_bytes(model, config.model.dtype, config.model.kv_cache_dtype)
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
    gpu = plan_gpu_memory(config, model, host, platform, env, weight_bytes, dtype_b, block)
    pool, offloaded = gpu.kv_pool_bytes, gpu.weights_offloaded_bytes

    num_blocks = pool // per_block if per_block else 0
    usable_blocks = max(0, num_blocks - 1)  # vLLM's block pool holds one null block back
    longest = usable_blocks * block
    model_max = model.max_position_embeddings or longest

    if config.model.max_model_len == "auto":
        max_len = min(model_max, longest)
        len_source: Literal["configured", "auto"] = "auto"
        if max_len <= 0:
            raise PlanError(
                "gpu.kv_cache_memory_bytes",
                f"the GPU KV pool ({pool / GIB:.2f} GiB) holds no whole block of "
                f"{block} tokens ({per_block} bytes); give the pool more memory",
            )
    else:
        max_len = config.model.max_model_len
        len_source = "configured"
        if max_len > longest:
            raise PlanError(
                "model.max_model_len",
                f"{max_len} tokens do not fit the GPU KV pool, which holds {longest} tokens "
                f"for one request. The CPU tier does not extend one request (vLLM keeps a "
                f"request's whole KV on the GPU); set model.max_model_len <= {longest} or "
                "'auto'",
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

    # --- CPU tier -------------------------------------------------------------------
    reserve = ram_reserve(host)
    room = tier_room(host, reserve, offloaded * tp * pp, tp * pp)
    tier = cpu_tier_bytes(config, backend, room, per_token, block, warnings)
    tier_blocks = tier // (per_block * tp) if per_block else 0
    tier_tokens = tier_blocks * block

    if backend != "none" and tier_tokens < max_len:
        warnings.append(
            f"the CPU tier ({tier_tokens} tokens) is smaller than one full-length "
            f"request ({max_len} tokens)"
        )
    if concurrency < 2:
        warnings.append(
            f"the GPU pool holds {concurrency:.2f} requests of {max_len} tokens; "
            "long requests will queue one at a time"
        )

    return Plan(
        platform=platform,
        model_path=model.path,
        architecture=model.architecture,
        kv_offload_backend=backend,
        kv_offload_backend_reason=backend_reason,
        block_size_tokens=block,
        cpu_chunk_tokens=chunk,
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
        tensor_parallel_size=tp,
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
        ("longest request", f"{plan.longest_request_tokens:,} tokens (must fit the GPU pool)"),
        (
            "max_model_len",
            f"{plan.max_model_len:,} tokens ({plan.max_model_len_source}; "
            f"model limit {plan.model_max_tokens:,})",
        ),
        ("concurrency", f"{plan.max_concurrency_at_full_length:.2f} requests at full length"),
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
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)
