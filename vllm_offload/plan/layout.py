"""The KV layout: which CPU tier (auto: native where an NVIDIA GPU is present), the GPU
block and the tier's chunk, and the KV element type ('fit': fp8 only where the model's own
dtype would need more weights offloaded to hold the target)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Literal

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.gpu import AUTO_OFFLOAD_ROOM_TOKENS, place_weights
from vllm_offload.plan.host import extension_bytes
from vllm_offload.plan.kv import kv_bytes_per_token, kv_dtype_bytes, without_hybrid_manager
from vllm_offload.plan.lengths import fit_lengths, target
from vllm_offload.plan.records import Backend, KvLayout, Notes, PlanError, PlanInputs, Platform, gib

# vLLM's CPU attention needs blocks in multiples of 32; 16 is vLLM's default on GPUs.
DEFAULT_BLOCK_SIZE: dict[Platform, int] = {"cuda": 16, "cpu": 128}
# With the native CPU tier, 128-token GPU blocks: the copy engine moves 64 KiB and 512 KiB
# descriptors alike, but each descriptor costs host time on the model runner's thread.
# On an H200 (issue #33) a lone CPU hit took 32.5 ms against 37.1 ms with 16-token
# blocks, eight at once 171 against 217 ms, and 0 % reuse at saturation showed no cost
# (docs/benchmarks.md, "GPU block size under the CPU tier"). Only for plain attention
# layers: MLA and hybrid models have backend-specific block sizes.
OFFLOAD_BLOCK_SIZE = 128
# Tokens per CPU-tier chunk with the native tier: fewer, larger transfers and lookups
# (CPU hit 80.6 -> 73.7 ms against one 16-token block per chunk, same run).
OFFLOAD_CHUNK_TOKENS = 256


def planned_model(model: ModelFacts, backend: Backend) -> ModelFacts:
    """The model as vLLM plans it with this backend: LMCache's connector turns vLLM's
    hybrid KV cache manager off, so sliding-window layers keep every token."""
    return without_hybrid_manager(model) if backend == "lmcache" else model


def resolve_backend(
    config: DeploymentConfig, host: HostFacts, platform: Platform
) -> tuple[Backend, str]:
    chosen = config.kv_offload.backend
    if chosen == "auto":
        if platform == "cuda" and host.has_nvidia_gpu:
            return "native", "auto: an NVIDIA GPU is present"
        return "none", "auto: no NVIDIA GPU, so no CPU KV tier"
    return chosen, "configured"


def choose_block(
    config: DeploymentConfig, model: ModelFacts, backend: Backend, platform: Platform
) -> tuple[int, Notes]:
    block = config.kv_offload.block_size
    if block != "auto":
        return block, Notes()
    plain_attention = all(layer.kind in ("full", "sliding") for layer in model.layers)
    if backend == "native" and plain_attention:
        block = OFFLOAD_BLOCK_SIZE
        why = (
            "fewer copies per CPU hit with the native tier (H200: a hit 32.5 ms vs 37.1 "
            "at 16; docs/benchmarks.md, #33)"
        )
    else:
        block = DEFAULT_BLOCK_SIZE[platform]
        why = "vLLM's default" if platform == "cuda" else "the CPU backend's (a multiple of 32)"
    return block, Notes(decisions=(f"kv_offload.block_size auto -> {block}: {why}",))


def layout_for(
    inputs: PlanInputs,
    backend: Backend,
    reason: str,
    block: int,
    cache_dtype: Literal["auto", "fp8"],
) -> KvLayout:
    """The layout at ``cache_dtype``; raises PlanError for a chunk that is not whole blocks."""
    config, model = inputs.config, inputs.model
    dtype_b = kv_dtype_bytes(model, config.model.dtype, cache_dtype)
    per_token = kv_bytes_per_token(model, dtype_b, config.parallel.tensor_parallel_size)
    configured = config.kv_offload.cpu_chunk_tokens
    if configured == "auto":
        chunk = max(OFFLOAD_CHUNK_TOKENS, block) if backend == "native" else block
    elif configured % block:
        raise PlanError(
            "kv_offload.cpu_chunk_tokens",
            f"{configured} is not a multiple of the block size ({block} tokens); use "
            f"{-(-configured // block) * block}",
        )
    else:
        chunk = configured
    return KvLayout(
        backend=backend,
        backend_reason=reason,
        block_tokens=block,
        chunk_tokens=chunk,
        cache_dtype=cache_dtype,
        dtype_bytes=dtype_b,
        bytes_per_token=per_token,
        bytes_per_block=per_token * block,
    )


def choose_layout(inputs: PlanInputs) -> tuple[KvLayout, Notes]:
    config, platform = inputs.config, inputs.platform
    backend, reason = resolve_backend(config, inputs.host, platform)
    notes = Notes()
    if config.kv_offload.backend == "auto":
        notes += Notes(
            decisions=(f"kv_offload.backend {reason.replace(': ', f' -> {backend}: ')}",)
        )
    if backend != "none" and platform != "cuda":
        notes += Notes.problem(
            "kv_offload.backend",
            "CPU KV offload needs an NVIDIA GPU; set kv_offload.backend = none",
        )
    inputs = replace(inputs, model=planned_model(inputs.model, backend))
    block, step = choose_block(config, inputs.model, backend, platform)
    notes += step
    cache_dtype = config.model.kv_cache_dtype
    refused = fp8_refused(inputs)
    if cache_dtype == "fit":
        cache_dtype, why = fit_kv_cache_dtype(
            inputs, layout_for(inputs, backend, reason, block, "auto")
        )
        if cache_dtype == "fp8" and refused == "refused":
            cache_dtype = "auto"
            why += (
                f", but {FP8_FLOAT16_HOPPER}: kept at the model's dtype "
                '(model.dtype = "bfloat16" lets fit choose fp8)'
            )
        notes += Notes(decisions=(f"model.kv_cache_dtype fit -> {cache_dtype}: {why}",))
    if cache_dtype.startswith("fp8") and refused == "refused":
        notes += Notes.problem(
            "model.kv_cache_dtype",
            f'{FP8_FLOAT16_HOPPER}; set model.dtype = "bfloat16" (the same bytes per value)',
        )
    elif cache_dtype.startswith("fp8") and refused == "unknown":
        notes += Notes(
            warnings=(
                f"fp8 KV with a float16 model: {FP8_FLOAT16_HOPPER}; on one, set "
                'model.dtype = "bfloat16"',
            )
        )
    return layout_for(inputs, backend, reason, block, cache_dtype), notes


# vLLM 0.33.0 serves an fp8 KV cache on a Hopper GPU with FlashAttention 3, which refuses
# float16 activations at the engine's first profile step ("For FP8 input, output must have
# dtype BF16"; the fork's AWQ model, float16 in its config.json, on an H200:
# benchmarks/results/fork-case-h200-vllm-0.33.0/chunk-2048/fp8.log.xz). It served in bfloat16.
FP8_FLOAT16_HOPPER = (
    "vLLM 0.33.0's FlashAttention 3 on a Hopper GPU (H100, H200) refuses fp8 KV beside "
    "float16 activations"
)
HOPPER = re.compile(r"\b(GH200|H100|H200|H800|H20)\b")


def fp8_refused(inputs: PlanInputs) -> Literal["no", "refused", "unknown"]:
    """Whether fp8 KV would fail to start for this model on this GPU: 'refused' on a
    Hopper GPU with float16 activations, 'unknown' where the GPU is not named (a declared
    one), 'no' otherwise."""
    dtype = inputs.config.model.dtype
    float16 = dtype == "float16" or (dtype == "auto" and inputs.model.torch_dtype == "float16")
    if inputs.platform != "cuda" or not float16:
        return "no"
    gpus = inputs.host.gpus
    if not gpus or inputs.host.gpu_source == "declared":
        return "unknown"
    return "refused" if HOPPER.search(gpus[0].name.upper()) else "no"


def fit_kv_cache_dtype(
    inputs: PlanInputs, at_model_dtype: KvLayout
) -> tuple[Literal["auto", "fp8"], str]:
    """model.kv_cache_dtype = 'fit': the model's dtype unless it cannot hold the target
    (max_model_len x min_concurrent_requests) without offloading more weights; then fp8.
    Two GPU budgets at the model's dtype are compared: with the target, and without."""
    config, model, platform = inputs.config, inputs.model, inputs.platform
    if platform != "cuda":
        return "auto", "the model's dtype (fp8 KV needs an NVIDIA GPU)"
    if config.model.max_model_len == "auto":
        return "auto", "the model's dtype (no length to reach: model.max_model_len is auto)"
    asked = f"{config.gpu.min_concurrent_requests} x {config.model.max_model_len:,} tokens"
    try:
        memory, _ = place_weights(inputs, at_model_dtype, target(config, model))
        extension, _ = extension_bytes(inputs)
        fit_lengths(inputs, at_model_dtype, memory.kv_pool_bytes, extension)
    except PlanError:
        return "fp8", f"at the model's dtype {asked} do not fit the GPU"
    if config.weights_offload.cpu_gib != "auto":
        return "auto", f"{asked} fit at the model's dtype"
    limit = model.max_len_limit
    one_request = (min(limit or AUTO_OFFLOAD_ROOM_TOKENS, AUTO_OFFLOAD_ROOM_TOKENS), 1)
    try:
        base = place_weights(inputs, at_model_dtype, one_request)[0].weights_offloaded_bytes
    except PlanError:  # even a short request needs offloading past what fits: no baseline
        base = 0
    if memory.weights_offloaded_bytes > base:
        return "fp8", (
            f"at the model's dtype {asked} need {gib(memory.weights_offloaded_bytes)} of "
            f"weights offloaded, {gib(base)} without them"
        )
    return "auto", f"{asked} fit at the model's dtype without offloading more weights"
