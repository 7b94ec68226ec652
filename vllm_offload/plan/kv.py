"""KV arithmetic: bytes per element, per token and per request, the pool that holds some
requests, and the longest request a pool holds. Pure functions of the model's shape.

The rule they serve: one request's KV must fit the GPU pool (vLLM never streams a
request's blocks during attention), in whole blocks, less the one block vLLM's pool holds
back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from vllm_offload.model.config_json import LayerKind
from vllm_offload.model.facts import DTYPE_BYTES, ModelFacts


def compute_dtype_bytes(model: ModelFacts, dtype: str) -> int:
    """Bytes per element of the weights and activations vLLM computes with."""
    if dtype != "auto":
        return DTYPE_BYTES[dtype]
    # vLLM runs float32 checkpoints in half precision unless asked otherwise.
    return min(model.dtype_bytes, 2)


def kv_dtype_bytes(model: ModelFacts, dtype: str, kv_cache_dtype: str = "auto") -> int:
    """Bytes per KV element: the cache dtype if set, else the model's compute dtype."""
    if kv_cache_dtype != "auto":
        return DTYPE_BYTES[kv_cache_dtype]
    return compute_dtype_bytes(model, dtype)


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


@dataclass(frozen=True, kw_only=True)
class KvSizing:
    """How one rank stores a request's KV: the model's layers, bytes per element, tokens
    per block and the tensor-parallel ranks the heads are split over."""

    model: ModelFacts
    dtype_bytes: int
    block_tokens: int
    tp: int = 1


def request_kv_bytes(kv: KvSizing, tokens: int) -> int:
    """GPU bytes one request of ``tokens`` needs, in whole blocks (sliding layers keep
    only their window)."""
    block = kv.block_tokens
    total = 0
    for layer in kv.model.layers:
        per_token = layer_kv_bytes_per_token(layer, kv.model, kv.dtype_bytes, kv.tp)
        kept = tokens
        if layer.kind == "sliding" and layer.window is not None:
            kept = min(tokens, layer.window + block)
        total += math.ceil(kept / block) * block * per_token
    return total


def pool_bytes_for(kv: KvSizing, tokens: int, requests: int) -> int:
    """The GPU KV pool, in bytes, that holds ``requests`` requests of ``tokens`` each in
    whole blocks, plus the one block vLLM's pool holds back."""
    per_block = kv_bytes_per_token(kv.model, kv.dtype_bytes, kv.tp) * kv.block_tokens
    if per_block == 0:
        return 0
    per_request = -(-request_kv_bytes(kv, tokens) // per_block)
    return (requests * per_request + 1) * per_block


def longest_for(kv: KvSizing, pool: int, requests: int, cap: int) -> int:
    """The longest request (up to ``cap`` tokens) of which ``requests`` fit ``pool`` bytes;
    0 when not even one block each does."""
    low, high = 0, cap  # pool_bytes_for grows with tokens: bisect for the last that fits
    while low < high:
        mid = (low + high + 1) // 2
        if pool_bytes_for(kv, mid, requests) <= pool:
            low = mid
        else:
            high = mid - 1
    return low


def without_hybrid_manager(model: ModelFacts) -> ModelFacts:
    """The model as vLLM plans it when its hybrid KV cache manager is off: sliding-window
    layers keep every token, like full attention."""
    layers = tuple(
        replace(layer, kind="full", window=None) if layer.kind == "sliding" else layer
        for layer in model.layers
    )
    return replace(model, layers=layers)
