"""How long one request may be, and how many at once: the GPU pool (and its host
extension, aligned as patch 0006 maps it) in whole blocks, max_model_len as configured
(checked) or 'auto' (the longest the pool holds), and the concurrency at full length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from vllm_offload.config import DeploymentConfig
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.gpu import AUTO_OFFLOAD_ROOM_TOKENS, Target
from vllm_offload.plan.kv import KvSizing, longest_for, pool_bytes_for, request_kv_bytes
from vllm_offload.plan.records import (
    CpuTier,
    KvLayout,
    Lengths,
    Notes,
    PlanError,
    PlanInputs,
)

# vLLM's switch for a max_model_len past the model's limit (its envs.py).
ALLOW_LONG_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
# Patch 0006 maps the host extension in 2 MiB granules (vllm_ext.kv_host_extension's
# MAP_GRANULE, which imports vLLM: the planner cannot).
HOST_MAP_GRANULE = 2 << 20


@dataclass(frozen=True, kw_only=True)
class PoolShape:
    """The KV pool in blocks: the GPU part, the host extension after it, the bytes one
    request (and several at once) may use, and the full-length requests it holds."""

    gpu_blocks: int
    extension_blocks: int
    usable_bytes: int
    concurrency: float = 0.0  # full-length requests, the extension's blocks included
    gpu_tokens: int = 0  # what vLLM logs as "KV cache size: N tokens"


def target(config: DeploymentConfig, model: ModelFacts) -> Target:
    """(tokens, requests) the GPU pool must hold at once: the configured length, or (auto)
    room for one ordinary request."""
    limit = model.max_len_limit
    tokens = (
        config.model.max_model_len
        if config.model.max_model_len != "auto"
        else min(limit or AUTO_OFFLOAD_ROOM_TOKENS, AUTO_OFFLOAD_ROOM_TOKENS)
    )
    return tokens, config.gpu.min_concurrent_requests


def mapping_step(model: ModelFacts, layout: KvLayout) -> int:
    """The blocks that keep a GPU/host boundary on a 2 MiB mapping granule in every
    layer's region: patch 0006 counts both parts of an extended pool in multiples of it."""
    page = layout.bytes_per_block // len(model.layers)
    return HOST_MAP_GRANULE // math.gcd(HOST_MAP_GRANULE, page)


def pool_shape(model: ModelFacts, layout: KvLayout, pool_bytes: int, extension: int) -> PoolShape:
    per_block = layout.bytes_per_block
    gpu_blocks = pool_bytes // per_block if per_block else 0
    if not (extension and per_block):
        return PoolShape(gpu_blocks=gpu_blocks, extension_blocks=0, usable_bytes=pool_bytes)
    step = mapping_step(model, layout)
    gpu_blocks = gpu_blocks // step * step
    extension_blocks = extension // per_block // step * step
    return PoolShape(
        gpu_blocks=gpu_blocks,
        extension_blocks=extension_blocks,
        usable_bytes=(gpu_blocks + extension_blocks) * per_block,
    )


def fit_lengths(
    inputs: PlanInputs, layout: KvLayout, pool_bytes: int, extension: int
) -> tuple[PoolShape, Lengths, Notes]:
    """The longest request, max_model_len and the concurrency at that length; raises
    PlanError (naming the field) when the configured length or concurrency does not fit."""
    config, model = inputs.config, inputs.model
    block, dtype_b = layout.block_tokens, layout.dtype_bytes
    tp = config.parallel.tensor_parallel_size
    requests = config.gpu.min_concurrent_requests
    kv = KvSizing(model=model, dtype_bytes=dtype_b, block_tokens=block, tp=tp)
    shape = pool_shape(model, layout, pool_bytes, extension)
    if extension and layout.bytes_per_block and not shape.gpu_blocks:
        raise _no_gpu_part(inputs, layout, pool_bytes)
    usable_blocks = max(0, shape.gpu_blocks - 1)  # vLLM's block pool holds one null block back
    # Sliding-window layers keep only their window, so one request may run past the blocks
    # a full-attention model could give it (up to the model's limit).
    model_limit = model.max_len_limit
    configured = config.model.max_model_len
    extended_tokens = (usable_blocks + shape.extension_blocks) * block
    cap = max(extended_tokens, model_limit or 0, configured if configured != "auto" else 0)
    longest = longest_for(kv, shape.usable_bytes, 1, cap)
    model_max = model_limit or longest
    notes = Notes()
    source: Literal["configured", "auto"]
    if configured == "auto":
        max_len, notes = _auto_length(
            inputs, layout, shape, pool_bytes=pool_bytes, longest=longest, extended=bool(extension)
        )
        source = "auto"
    else:
        max_len, source = configured, "configured"
        notes = _check_configured(inputs, layout, shape, longest, bool(extension))
    per_block = layout.bytes_per_block
    blocks_per_request = request_kv_bytes(kv, max_len) // per_block if per_block else 1
    concurrency = shape.gpu_blocks / blocks_per_request if blocks_per_request else 0.0
    gpu_tokens = int(concurrency * max_len)
    concurrency += shape.extension_blocks / blocks_per_request if blocks_per_request else 0.0
    shape = PoolShape(
        gpu_blocks=shape.gpu_blocks,
        extension_blocks=shape.extension_blocks,
        usable_bytes=shape.usable_bytes,
        concurrency=concurrency,
        gpu_tokens=gpu_tokens,
    )
    lengths = Lengths(
        longest_request_tokens=longest,
        model_max_tokens=model_max,
        max_model_len=max_len,
        source=source,
        concurrency_at_full_length=round(concurrency, 2),
        min_concurrent_requests=requests,
    )
    return shape, lengths, notes


def _no_gpu_part(inputs: PlanInputs, layout: KvLayout, pool_bytes: int) -> PlanError:
    """A host extension continues a GPU part of whole mapping steps; with none, patch 0006
    refuses to start (vllm_ext.kv_host_extension.split_blocks)."""
    step = mapping_step(inputs.model, layout)
    least = step * layout.bytes_per_block
    configured = inputs.config.gpu.kv_cache_memory_bytes != "auto"
    field = "gpu.kv_cache_memory_bytes" if configured else "gpu.memory_utilization"
    return PlanError(
        field,
        f"the GPU KV pool ({pool_bytes:,} bytes once any staging scratch is taken) holds no "
        f"{step} whole blocks ({step * layout.block_tokens:,} tokens, {least:,} bytes: each "
        "layer's part of the pool is mapped in 2 MiB granules), the smallest GPU part a "
        f"host extension continues; give the pool at least {least - pool_bytes:,} bytes "
        "more, or set kv_offload.host_extension_gib = 0",
    )


def _auto_length(
    inputs: PlanInputs,
    layout: KvLayout,
    shape: PoolShape,
    *,
    pool_bytes: int,
    longest: int,
    extended: bool,
) -> tuple[int, Notes]:
    """max_model_len 'auto': the longest the pool holds for gpu.min_concurrent_requests at
    once (``longest``: for one), capped at the model's limit."""
    model = inputs.model
    model_max = model.max_len_limit or longest
    tp = inputs.config.parallel.tensor_parallel_size
    requests = inputs.config.gpu.min_concurrent_requests
    block = layout.block_tokens
    kv = KvSizing(model=model, dtype_bytes=layout.dtype_bytes, block_tokens=block, tp=tp)
    max_len = (
        min(model_max, longest)
        if requests == 1
        else longest_for(kv, shape.usable_bytes, requests, model_max)
    )
    pool_name = "GPU KV pool and host extension" if extended else "GPU KV pool"
    if inputs.platform == "cpu":  # vLLM's CPU backend: the pool is host RAM
        pool_name = "KV pool"
    if max_len <= 0:
        raise PlanError(
            "gpu.kv_cache_memory_bytes",
            f"the GPU KV pool ({pool_bytes / (1 << 30):.2f} GiB) holds no whole block of "
            f"{block} tokens ({layout.bytes_per_block} bytes) for each of {requests} "
            "request(s); give the pool more memory",
        )
    held = "one request" if requests == 1 else f"{requests} requests at once"
    verb = "hold" if extended else "holds"
    why = (
        "the model's limit"
        if max_len == model_max
        else f"the longest the {pool_name} {verb} for {held}"
    )
    return max_len, Notes(decisions=(f"model.max_model_len auto -> {max_len:,}: {why}",))


def _check_configured(
    inputs: PlanInputs, layout: KvLayout, shape: PoolShape, longest: int, extended: bool
) -> Notes:
    """A configured max_model_len: refused (naming the field) where one request, or
    gpu.min_concurrent_requests of them, do not fit."""
    config, model, platform = inputs.config, inputs.model, inputs.platform
    max_len = int(config.model.max_model_len)
    block, dtype_b = layout.block_tokens, layout.dtype_bytes
    tp, requests = config.parallel.tensor_parallel_size, config.gpu.min_concurrent_requests
    offload_hint = (
        "; or set weights_offload.cpu_gib = 'auto' to offload the weights that make room"
        if platform == "cuda" and config.weights_offload.cpu_gib != "auto"
        else ""
    )
    if platform == "cuda" and config.model.kv_cache_dtype == "auto":
        offload_hint += (
            "; or model.kv_cache_dtype = 'fit' (fp8 KV where the model's dtype does not fit: "
            "twice the tokens)"
        )
    if max_len > longest:
        where = (
            "GPU KV pool and its host extension, which hold"
            if extended
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
            instead={"model.max_model_len": "auto"},
        )
    kv = KvSizing(model=model, dtype_bytes=dtype_b, block_tokens=block, tp=tp)
    if pool_bytes_for(kv, max_len, requests) > shape.usable_bytes:
        reach = longest_for(kv, shape.usable_bytes, requests, max_len)
        request_blocks = -(-request_kv_bytes(kv, max_len) // layout.bytes_per_block)
        usable_blocks = max(0, shape.gpu_blocks - 1)
        raise PlanError(
            "gpu.min_concurrent_requests",
            f"the GPU KV pool holds "
            f"{(usable_blocks + shape.extension_blocks) // request_blocks} request(s) of "
            f"{max_len} tokens at once, not {requests}: lower it, or model.max_model_len "
            f"to {reach}{offload_hint}",
            instead={"model.max_model_len": reach} if reach > 0 else None,
        )
    return Notes()


def long_len_allowed(config: DeploymentConfig, env: dict[str, str]) -> bool:
    """Whether vLLM takes a max_model_len past the model's limit: asked for in the config,
    or already in the server's environment (vLLM's envs.py reads it so)."""
    allowed = env.get(ALLOW_LONG_LEN_ENV, "0").strip().lower() in ("1", "true")
    return config.model.allow_long_max_model_len or allowed


def past_the_model_limit(inputs: PlanInputs) -> Notes:
    """A configured max_model_len past the model's limit: vLLM refuses to start with it
    (config/model.py _get_and_verify_max_len) unless told it is on purpose."""
    config, model, env = inputs.config, inputs.model, inputs.env
    max_len, limit = config.model.max_model_len, model.max_len_limit
    if max_len == "auto" or not limit or max_len <= limit:
        return Notes()
    if long_len_allowed(config, env):
        return Notes(
            warnings=(
                f"max_model_len {max_len} is past the model's limit of {limit:,} "
                f"({model.max_len_key}), allowed on purpose: with RoPE, positions past it give "
                "NaN; with absolute positions, out-of-bounds errors",
            )
        )
    raise PlanError(
        "model.max_model_len",
        f"{max_len} tokens are past the model's limit of {limit:,} ({model.max_len_key} in "
        f"its config.json, as vLLM derives it), and vLLM refuses to start with that: set "
        f"model.max_model_len <= {limit} or 'auto'; or, if the model was trained or scaled "
        f"past it, model.allow_long_max_model_len = true (vLLM's {ALLOW_LONG_LEN_ENV})",
        instead={"model.max_model_len": limit},
    )


def capacity_warnings(
    layout: KvLayout, tier: CpuTier, lengths: Lengths, shape: PoolShape, extended: bool
) -> Notes:
    """What the sizes mean for long requests: a tier shorter than one, a pool that queues
    them one at a time."""
    warnings = []
    if layout.backend != "none" and tier.tokens < lengths.max_model_len:
        warnings.append(
            f"the CPU tier ({tier.tokens} tokens) is smaller than one full-length "
            f"request ({lengths.max_model_len} tokens)"
        )
    if shape.concurrency < 2 and not extended:
        warnings.append(
            f"the GPU pool holds {shape.concurrency:.2f} requests of {lengths.max_model_len} "
            "tokens; long requests will queue one at a time"
        )
    return Notes(warnings=tuple(warnings))
