"""The GPU scratch of staged prefill (issue #41): with a host extension, a prefill chunk of
a request whose KV reaches host RAM copies its context into GPU scratch once per layer
(vllm_ext.staged_attention) instead of reading its host blocks over PCIe once per query
tile. The scratch holds the context of the longest request for one layer, one buffer all
layers share in turn; the GPU KV pool is smaller by it, and gives it at most
``SCRATCH_MAX_POOL_SHARE`` of itself (a request longer than the scratch reads in place)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_offload.plan.lengths import pool_shape
from vllm_offload.plan.records import KvLayout, Notes, PlanInputs, gib
from vllm_offload.upstream.version import has_staged_prefill
from vllm_offload.vllm_ext.staged_prefill import scratch_bytes

# Each scratch token costs 1 / layers of a pool token: with few layers the whole context
# would eat the pool (the demo model's two layers: half of it). The 8B shape's 65,536
# tokens on 2 GiB need 12.5 %.
SCRATCH_MAX_POOL_SHARE = 0.25


@dataclass(frozen=True, kw_only=True)
class StagingScratch:
    """GPU bytes taken from the pool, and the tokens of one layer's context they hold."""

    bytes: int = 0
    tokens: int = 0


def staging_scratch(
    inputs: PlanInputs, layout: KvLayout, pool_bytes: int, extension: int
) -> tuple[StagingScratch, Notes]:
    """The scratch for a pool of ``pool_bytes`` with ``extension`` bytes of host RAM after
    it (none without one, with kv_offload.staged_prefill off, on a vLLM release whose
    FlashAttention staged_attention does not fit, or when no request can reach the host
    part)."""
    config, model = inputs.config, inputs.model
    per_block = layout.bytes_per_block
    if not (extension and per_block and config.kv_offload.staged_prefill):
        return StagingScratch(), Notes()
    if not has_staged_prefill(inputs.vllm_release):
        return StagingScratch(), Notes(
            decisions=(
                f"staging scratch: none (vLLM {inputs.vllm_release}'s FlashAttention is not "
                "the one staged prefill extends); a spilled request's prefill reads its host "
                "blocks in place",
            )
        )
    if layout.dtype_bytes > 2:  # float32: vLLM serves it without FlashAttention
        return StagingScratch(), Notes(
            decisions=(
                "staging scratch: none (a float32 KV cache is read by an attention backend "
                "other than FlashAttention, which staged prefill extends); a spilled "
                "request's prefill reads its host blocks in place",
            )
        )
    block = layout.block_tokens
    page = per_block // len(model.layers)
    shape = pool_shape(model, layout, pool_bytes, extension)
    configured = config.model.max_model_len
    longest = int(configured) if configured != "auto" else model.max_len_limit
    longest = min(longest, (shape.gpu_blocks + shape.extension_blocks - 1) * block)
    if longest <= (shape.gpu_blocks - 1) * block:  # the GPU part holds every request
        return StagingScratch(), Notes()
    tokens = -(-longest // block) * block
    cap = int(pool_bytes * SCRATCH_MAX_POOL_SHARE)
    longer = ""
    if scratch_bytes(tokens=tokens, block_size=block, page_bytes=page) > cap:
        tokens = cap // page * block
        longer = (
            f"; a spilled request longer than {tokens:,} tokens reads its host blocks in "
            "place (slow)"
        )
    scratch = scratch_bytes(tokens=tokens, block_size=block, page_bytes=page)
    if not scratch:
        return StagingScratch(), Notes(
            decisions=(
                f"staging scratch: none ({gib(cap)} of the pool holds no block of it); a "
                "spilled request's prefill reads its host blocks in place",
            )
        )
    return StagingScratch(bytes=scratch, tokens=tokens), Notes(
        decisions=(
            f"staging scratch: {gib(scratch)} of the GPU KV pool ({tokens:,} tokens of one "
            "layer, shared by all layers) so that a spilled request's prefill copies its "
            f"context once per layer instead of reading host RAM once per query tile{longer} "
            "(kv_offload.staged_prefill)",
        )
    )
