"""The GPU scratch of staged prefill (issue #41): with a host extension, a prefill chunk of
a spilled request copies the host blocks of its context into GPU scratch once per layer
instead of reading them over PCIe once per query tile. The scratch holds the most one
request can spill (every host block, or what max_model_len leaves past the GPU part) for
one layer, in ``SCRATCH_BUFFERS`` buffers that all layers share; the GPU KV pool is
smaller by it, and gives it at most ``SCRATCH_MAX_POOL_SHARE`` of itself (past that, a
request's prefill stages in several passes)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_offload.config import DeploymentConfig
from vllm_offload.model_facts import ModelFacts
from vllm_offload.plan.lengths import HOST_MAP_GRANULE, pool_shape
from vllm_offload.plan.records import KvLayout, Notes, gib
from vllm_offload.vllm_ext.staged_prefill import SCRATCH_BUFFERS, scratch_blocks

# Each scratch token costs SCRATCH_BUFFERS / layers of a pool token, and takes the GPU part
# a spilled token more: with few layers the exact size would eat the pool (the demo
# model's two layers: all of it). The 8B shape's 65,536 tokens on 2 GiB need 20 %.
SCRATCH_MAX_POOL_SHARE = 0.25


@dataclass(frozen=True, kw_only=True)
class StagingScratch:
    """GPU bytes taken from the pool, and the spilled tokens of context one pass stages."""

    bytes: int = 0
    tokens: int = 0


def staging_scratch(
    config: DeploymentConfig,
    model: ModelFacts,
    layout: KvLayout,
    pool_bytes: int,
    extension: int,
) -> tuple[StagingScratch, Notes]:
    """The scratch for a pool of ``pool_bytes`` with ``extension`` bytes of host RAM after
    it (none without one)."""
    per_block = layout.bytes_per_block
    if not (extension and per_block):
        return StagingScratch(), Notes()
    block = layout.block_tokens
    page = per_block // len(model.layers)
    configured = config.model.max_model_len
    longest = int(configured) if configured != "auto" else model.max_len_limit
    cap = int(pool_bytes * SCRATCH_MAX_POOL_SHARE)
    # The most one request spills: every host block, or what the longest request leaves
    # past the GPU part, which the scratch itself shrinks (a few rounds settle it).
    host_tokens = pool_shape(model, layout, pool_bytes, extension).extension_blocks * block
    blocks, scratch = 0, 0
    while scratch <= cap:
        gpu = pool_shape(model, layout, pool_bytes - scratch, extension).gpu_blocks
        need = min(host_tokens, longest - max(0, gpu - 1) * block) if longest else host_tokens
        if need <= blocks * block:
            break
        blocks, scratch = scratch_blocks(spill_tokens=need, block_size=block, page_bytes=page)
    capped = scratch > cap
    if capped:  # whole granules of pages within the cap
        granule = HOST_MAP_GRANULE * SCRATCH_BUFFERS
        scratch = cap // granule * granule
        blocks = scratch // (page * SCRATCH_BUFFERS)
    if not scratch:  # nothing spills, or the cap holds no granule
        return StagingScratch(), Notes(
            decisions=(
                f"staging scratch: none ({gib(cap)} of the pool holds no mapping granule of it); "
                "a spilled request's prefill reads its host blocks in place",
            )
            if capped
            else ()
        )
    tokens = blocks * block
    split = (
        f"; a request spilling more than {tokens:,} tokens stages in several passes "
        "(exact arithmetic, not bit-identical)"
        if capped
        else ""
    )
    return StagingScratch(bytes=scratch, tokens=tokens), Notes(
        decisions=(
            f"staging scratch: {gib(scratch)} of the GPU KV pool ({SCRATCH_BUFFERS} buffers of "
            f"{tokens:,} tokens of one layer, shared by all layers) so that a spilled request's "
            f"prefill copies its host blocks once per layer{split} (issue #41; until vLLM's side "
            "of it lands, this memory stays unused)",
        )
    )
