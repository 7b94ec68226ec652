"""The GPU scratch of staged prefill (issue #41): with a host extension, a prefill chunk of
a spilled request copies the host blocks of its context into GPU scratch once per layer
instead of reading them over PCIe once per query tile. The scratch holds the most one
request can spill (every host block, or what max_model_len leaves past the GPU part) for
one layer, in
``SCRATCH_BUFFERS`` buffers that all layers share; the GPU KV pool is smaller by it."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_offload.config import DeploymentConfig
from vllm_offload.model_facts import ModelFacts
from vllm_offload.plan.lengths import pool_shape
from vllm_offload.plan.records import KvLayout, Notes, PlanError, gib
from vllm_offload.vllm_ext.staged_prefill import SCRATCH_BUFFERS, scratch_blocks


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
    it (none without one); PlanError when the pool cannot give it."""
    per_block = layout.bytes_per_block
    if not (extension and per_block):
        return StagingScratch(), Notes()
    block = layout.block_tokens
    page = per_block // len(model.layers)
    configured = config.model.max_model_len
    longest = int(configured) if configured != "auto" else model.max_position_embeddings
    # The most one request spills: every host block, or what the longest request leaves
    # past the GPU part, which the scratch itself shrinks (a few rounds settle it).
    shape = pool_shape(model, layout, pool_bytes, extension)
    host_tokens = shape.extension_blocks * block
    spill, blocks, scratch = 0, 0, 0
    while True:
        gpu_tokens = (
            max(0, pool_shape(model, layout, pool_bytes - scratch, extension).gpu_blocks - 1)
            * block
        )
        need = min(host_tokens, longest - gpu_tokens) if longest else host_tokens
        if need <= blocks * block:
            break
        spill = need
        blocks, scratch = scratch_blocks(spill_tokens=spill, block_size=block, page_bytes=page)
    if not scratch:  # max_model_len fits the GPU part: nothing spills
        return StagingScratch(), Notes()
    if scratch >= pool_bytes:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"staging a prefill over {spill:,} spilled tokens takes {gib(scratch)} of GPU "
            f"memory, and the GPU KV pool is {gib(pool_bytes)}: lower it, or "
            "model.max_model_len, or give the pool more memory",
        )
    tokens = blocks * block
    return StagingScratch(bytes=scratch, tokens=tokens), Notes(decisions=(
        f"staging scratch: {gib(scratch)} of the GPU KV pool ({SCRATCH_BUFFERS} buffers of "
        f"{tokens:,} tokens of one layer, shared by all layers) so that a spilled request's "
        "prefill copies its host blocks once per layer (issue #41; until vLLM's side of it "
        "lands, this memory stays unused)",
    ))  # fmt: skip
