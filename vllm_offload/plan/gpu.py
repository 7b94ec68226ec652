"""One GPU's weights (as configured, or the fewest whole layers that leave a pool for the
target) and the KV pool left of its budget (plan.budget); what no offload can reach is
refused with the longest length that is reachable."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.budget import GpuBudget, gpu_budget, served_weight_bytes
from vllm_offload.plan.host import ram_that_holds, ram_words, tenths, weights_ram_refusal
from vllm_offload.plan.kv import KvSizing, longest_for, pool_bytes_for
from vllm_offload.plan.parts import component_rows
from vllm_offload.plan.records import KvLayout, Notes, PlanError, PlanInputs, Weights, gib

# The CPU backend's KV pool when neither the config nor VLLM_CPU_KVCACHE_SPACE sizes it.
CPU_PLATFORM_DEFAULT_POOL_BYTES = 1 * GIB
# Offloading weights 'auto' without a length to reach leaves room for one request this long.
AUTO_OFFLOAD_ROOM_TOKENS = 4096

Target = tuple[int, int]  # (tokens, requests) the pool must hold at once


@dataclass(frozen=True, kw_only=True)
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


def weights_record(config: DeploymentConfig, model: ModelFacts, memory: GpuMemory) -> Weights:
    """The plan's weights: at the dtype served (``model`` as planned), where they went."""
    return Weights(
        bytes=served_weight_bytes(config, model),
        source=model.weight_bytes_source,
        gpu_bytes=memory.weights_gpu_bytes,
        offloaded_bytes=memory.weights_offloaded_bytes,
        prefetch_group_size=memory.prefetch_group_size,
        prefetch_num_in_group=memory.prefetch_num_in_group,
        offloaded_layers=memory.offloaded_layers,
        components=component_rows(model),
    )


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


def cpu_platform_memory(
    config: DeploymentConfig, weight_bytes: int, env: dict[str, str]
) -> GpuMemory:
    """vLLM's CPU backend: weights in RAM, the KV pool as VLLM_CPU_KVCACHE_SPACE (which
    wins inside vLLM), the config, or 1 GiB (vLLM's own default takes most of the RAM)."""
    weights_per_rank = weight_bytes // config.parallel.ranks
    space = env.get("VLLM_CPU_KVCACHE_SPACE", "")
    if space:
        pool = int(space) * GIB
    elif config.gpu.kv_cache_memory_bytes != "auto":
        pool = config.gpu.kv_cache_memory_bytes
    else:
        pool = CPU_PLATFORM_DEFAULT_POOL_BYTES
    return GpuMemory(
        total_bytes=0,
        budget_bytes=0,
        weights_offloaded_bytes=0,
        weights_gpu_bytes=weights_per_rank,
        kv_pool_bytes=pool,
    )


def place_weights(inputs: PlanInputs, layout: KvLayout, target: Target) -> tuple[GpuMemory, Notes]:
    """Weights on the GPU or offloaded (as configured, or the fewest that leave a pool for
    ``target`` in ``layout``'s blocks and KV dtype), then the KV pool from what is left (or
    as configured); raises PlanError when nothing is left."""
    config, model = inputs.config, inputs.model
    weight_bytes = served_weight_bytes(config, model)
    if inputs.platform != "cuda":
        return cpu_platform_memory(config, weight_bytes, inputs.env), Notes()
    gpu = gpu_budget(inputs, weight_bytes)
    offloaded = offloaded_bytes(inputs, layout, gpu, target)
    overhead = gpu.overhead_bytes + (gpu.prefetch_buffer_bytes if offloaded else 0)
    group_size = num_in_group = offloaded_layers = 0
    if gpu.prefetch_buffer_bytes and offloaded > 0:
        needed = min(model.num_layers, math.ceil(offloaded / gpu.layer_bytes))
        group_size, num_in_group, offloaded_layers = prefetch_layout(model.num_layers, needed)
        offloaded = offloaded_layers * gpu.layer_bytes
        if offloaded > gpu.ram_room_bytes:  # whole layers rounded past the room
            raise weights_ram_refusal(
                inputs.host, gpu.ram_room_bytes, offloaded, config.parallel.ranks
            )
    weights_gpu = gpu.weights_bytes - offloaded
    memory = GpuMemory(
        total_bytes=gpu.total_bytes,
        budget_bytes=gpu.budget_bytes,
        weights_offloaded_bytes=offloaded,
        weights_gpu_bytes=weights_gpu,
        kv_pool_bytes=pool_bytes(config, gpu, weights_gpu, overhead, offloaded),
        prefetch_group_size=group_size,
        prefetch_num_in_group=num_in_group,
        offloaded_layers=offloaded_layers,
    )
    return memory, offload_note(config, memory, target)


def offloaded_bytes(inputs: PlanInputs, layout: KvLayout, gpu: GpuBudget, target: Target) -> int:
    """The weights kept in host RAM per GPU: as configured (refused past the host's room),
    or with 'auto' the fewest, rounded up to the 0.1 GiB shown, that leave a pool for
    ``target``; raises PlanError when no offload reaches it."""
    config = inputs.config
    offload, fixed_pool = config.weights_offload.cpu_gib, config.gpu.kv_cache_memory_bytes
    if offload != "auto":
        offloaded = min(int(offload * GIB), gpu.weights_bytes)
        if offloaded > gpu.ram_room_bytes:
            raise weights_ram_refusal(
                inputs.host, gpu.ram_room_bytes, offloaded, config.parallel.ranks
            )
        return offloaded
    tokens, requests = target
    kv = KvSizing(
        model=inputs.model,
        dtype_bytes=layout.dtype_bytes,
        block_tokens=layout.block_tokens,
        tp=config.parallel.tensor_parallel_size,
    )
    room = fixed_pool if fixed_pool != "auto" else pool_bytes_for(kv, tokens, requests)
    need = gpu.weights_bytes + gpu.overhead_bytes + room - gpu.budget_bytes
    if need > 0:
        need += gpu.prefetch_buffer_bytes
    if need > gpu.offloadable_bytes:
        weight_bytes = served_weight_bytes(config, inputs.model)
        raise unreachable(inputs, layout, weight_bytes, target, room)
    return max(0, min(int(math.ceil(need / GIB * 10) / 10 * GIB), gpu.offloadable_bytes))


def offload_note(config: DeploymentConfig, memory: GpuMemory, target: Target) -> Notes:
    """What 'auto' chose for weights_offload.cpu_gib, and for what pool (none when set)."""
    if config.weights_offload.cpu_gib != "auto":
        return Notes()
    offloaded, layers = memory.weights_offloaded_bytes, memory.offloaded_layers
    fixed_pool = config.gpu.kv_cache_memory_bytes
    tokens, requests = target
    what = f"{gib(offloaded)} per GPU" + (f" ({layers} whole layers)" if layers else "")
    room_for = (
        f"the configured {gib(fixed_pool)} GPU KV pool"
        if fixed_pool != "auto"
        else f"a GPU KV pool of {requests} x {tokens:,} tokens"
    )
    return Notes(
        decisions=(
            f"weights_offload.cpu_gib auto -> {what}: the fewest that leave room for {room_for}"
            if offloaded
            else f"weights_offload.cpu_gib auto -> 0: the weights fit with room for {room_for}",
        )
    )


def pool_bytes(
    config: DeploymentConfig, gpu: GpuBudget, weights_gpu: int, overhead: int, offloaded: int
) -> int:
    """The GPU KV pool: as configured, or what the budget leaves beside ``weights_gpu`` and
    vLLM's working memory; raises PlanError when none is left or a set one does not fit."""
    fixed_pool = config.gpu.kv_cache_memory_bytes
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
            instead={"weights_offload.cpu_gib": "auto"} if offloaded == 0 else None,
        )
    # vLLM takes a fixed pool as given, past memory_utilization: one larger than the card
    # less the weights kept there fails at start-up after the weights load.
    largest = gpu.total_bytes - weights_gpu - overhead
    if fixed_pool != "auto" and fixed_pool > largest:
        raise PlanError(
            "gpu.kv_cache_memory_bytes",
            f"a {gib(fixed_pool)} GPU KV pool, {gib(weights_gpu)} of weights and ~"
            f"{gib(overhead)} of vLLM's working memory do not fit the "
            f"{gib(gpu.total_bytes)} GPU: set it <= {max(0, largest)} bytes, 'auto', or keep "
            "more weights in host RAM (weights_offload.cpu_gib)",
        )
    return pool


def reachable_tokens(
    inputs: PlanInputs, weight_bytes: int, dtype_b: int, block: int, requests: int
) -> int:
    """The longest request of which ``requests`` fit the GPU pool left with every decoder
    layer's weights offloaded (capped at the model's limit), at ``dtype_b`` bytes per KV
    element in blocks of ``block`` tokens."""
    config, model = inputs.config, inputs.model
    gpu = gpu_budget(inputs, weight_bytes)
    cap = model.max_len_limit or 1 << 24
    tp = config.parallel.tensor_parallel_size
    kv = KvSizing(model=model, dtype_bytes=dtype_b, block_tokens=block, tp=tp)
    return longest_for(kv, gpu.largest_pool_bytes(), requests, cap)


def unreachable(
    inputs: PlanInputs, layout: KvLayout, weight_bytes: int, target: Target, room: int
) -> PlanError:
    """Why no weight offload reaches ``target``, the longest length that is reachable, and
    what else would reach further, each with its number."""
    config, host = inputs.config, inputs.host
    dtype_b, block = layout.dtype_bytes, layout.block_tokens
    tokens, requests = target
    gpu = gpu_budget(inputs, weight_bytes)
    if config.gpu.kv_cache_memory_bytes != "auto":
        return PlanError(
            "gpu.kv_cache_memory_bytes",
            f"a {gib(room)} GPU KV pool does not fit even with every decoder layer's weights "
            f"in host RAM ({gib(gpu.offloadable_bytes)} per GPU): set it <= "
            f"{max(0, gpu.largest_pool_bytes())} bytes, or 'auto'",
        )
    best = reachable_tokens(inputs, weight_bytes, dtype_b, block, requests)
    world = config.parallel.ranks
    offloaded_words = (
        f"with as many weights in host RAM as it holds (weights_offload.cpu_gib <= "
        f"{tenths(gpu.ram_room_bytes):g}: {ram_words(host, world, 'cuda')})"
        if gpu.ram_bound
        else f"even with every decoder layer's weights in host RAM "
        f"({gib(gpu.offloadable_bytes)} per GPU)"
    )
    need = (
        gpu.weights_bytes + gpu.overhead_bytes + room - gpu.budget_bytes + gpu.prefetch_buffer_bytes
    )
    layers_reach = need <= min(gpu.weights_bytes, gpu.layer_bytes * gpu.layers)
    helps = []
    if gpu.ram_bound:
        helps.append(ram_that_holds(need, world, "cuda") if layers_reach else "more host RAM")
    if dtype_b > 1:
        fp8 = reachable_tokens(inputs, weight_bytes, 1, block, requests)
        helps.append(f"model.kv_cache_dtype = 'fp8' ({fp8:,} tokens)")
    if config.gpu.memory_utilization < 0.95:
        roomier = config.model_copy(
            update={"gpu": config.gpu.model_copy(update={"memory_utilization": 0.95})}
        )
        more = reachable_tokens(
            replace(inputs, config=roomier), weight_bytes, dtype_b, block, requests
        )
        helps.append(f"gpu.memory_utilization = 0.95 ({more:,} tokens)")
    if host.gpus:
        tp = config.parallel.tensor_parallel_size * 2
        wider = config.model_copy(
            update={"parallel": config.parallel.model_copy(update={"tensor_parallel_size": tp})}
        )
        twice = replace(host, gpus=tuple(replace(host.gpus[0], index=i) for i in range(tp)))
        more = reachable_tokens(
            replace(inputs, config=wider, host=twice), weight_bytes, dtype_b, block, requests
        )
        helps.append(f"{tp} GPUs (parallel.tensor_parallel_size = {tp}: {more:,} tokens)")
    field_name = "model.max_model_len" if config.model.max_model_len != "auto" else "gpu"
    limit = f"set model.max_model_len <= {best:,}" if best > 0 else "no request length fits at all"
    return PlanError(
        field_name,
        f"{requests} request(s) of {tokens:,} tokens need a {gib(room)} GPU KV pool, but "
        f"{offloaded_words} the pool is "
        f"{gib(max(0, gpu.largest_pool_bytes()))}: {limit}"
        + (f" (gpu.min_concurrent_requests = {requests})" if requests > 1 else "")
        + ". What else would reach further: "
        + "; ".join(helps or ["a GPU with more memory"]),
    )
