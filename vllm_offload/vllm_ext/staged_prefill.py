"""Staged prefill (issue #41): how a prefill chunk of a request whose KV reaches the host
extension (patch 0006) attends to its host-resident blocks without reading them over PCIe
once per query tile.

Per layer, the host blocks of the chunk's context are copied once into GPU *scratch*
blocks and the kernel reads them there through a rewritten block table; the chunk's own
K/V that belong in host blocks are written there as usual (for later steps) and mirrored
into the scratch. Decode rows keep their tables and read host blocks in place (once per
step, at the link's speed). Scratch block IDs are GPU block IDs the pool never hands out;
in every layer's region they map one of ``SCRATCH_BUFFERS`` physical buffers (layer %
buffers), so 32 layers time-share one layer's worth (vllm-ascend#12852's layer-wise buffer
reuse), and layer l+1's copy overlaps layer l's work.

Pure functions of block IDs and token counts, no vLLM or torch: the metadata builder
calls ``stage_chunk`` per prefilling request and step, the scheduler side
``chunk_tokens_that_fit``, the engine core and the planner ``scratch_blocks`` and
``scratch_ids``, the worker's mapping ``scratch_ranges``.
docs/design/long-context.md ("Staged prefill") has the schedule and the measurements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Two buffers let layer l+1's copy run during all of layer l (one waits for layer l's
# attention to end): at 2,048-token chunks one buffer cost 7.5 % of TTFT, two 0.9 %
# (benchmarks/results/long_context/staged_prefill_probe-h100.json).
SCRATCH_BUFFERS = 2
# cuMemMap maps whole granules: each layer's run of scratch blocks starts and ends on one.
MAP_GRANULE = 2 << 20

BlockPair = tuple[int, int]  # (host block ID, scratch block ID)


@dataclass(frozen=True, kw_only=True)
class StagedPass:
    """One kernel call over part of a chunk's context, per layer.

    ``block_table``: the row the kernel reads (host IDs replaced by scratch IDs);
    ``seq_len``: the keys it holds; ``causal``: the pass that ends with the chunk's own
    tokens (the others hold past keys only, which every query of the chunk sees);
    ``copies``: host blocks to copy into scratch before the kernel, because they hold
    keys written by earlier steps; ``mirrors``: host blocks the chunk writes, whose new
    K/V are written into the scratch too (a block can be in both: its start is older)."""

    block_table: tuple[int, ...]
    seq_len: int
    causal: bool
    copies: tuple[BlockPair, ...]
    mirrors: tuple[BlockPair, ...]


@dataclass(frozen=True, kw_only=True)
class CopyRun:
    """``count`` consecutive blocks from host block ``src`` to scratch block ``dst``: one
    memcpy per layer and run."""

    src: int
    dst: int
    count: int


def stage_chunk(
    *,
    block_table: Sequence[int],
    start: int,
    new_tokens: int,
    block_size: int,
    first_host_block: int,
    scratch: Sequence[int],
) -> tuple[StagedPass, ...]:
    """The passes a chunk of ``new_tokens`` tokens after ``start`` computed ones needs.

    One pass (the kernel's own, over the same keys in the same order: bit-identical to
    an all-GPU pool) when the scratch holds every host block of the context; else the
    host blocks of the past context are split over passes of at most ``len(scratch)``
    blocks each, whose outputs the caller merges by their log-sum-exp (exact in
    arithmetic, not bit-identical). Without host blocks: one pass over the row unchanged,
    nothing to copy. ValueError when the chunk's own host blocks alone exceed
    the scratch (``chunk_tokens_that_fit`` says how many tokens would fit)."""
    if new_tokens <= 0 or start < 0 or block_size <= 0:
        raise ValueError(
            f"a chunk needs new tokens after >= 0 computed ones: {start=}, "
            f"{new_tokens=}, {block_size=}"
        )
    end = start + new_tokens
    used = -(-end // block_size)
    if len(block_table) < used:
        raise ValueError(f"the block table has {len(block_table)} blocks, {used} needed")
    if len(set(scratch)) != len(scratch) or any(s >= first_host_block for s in scratch):
        raise ValueError("scratch blocks must be distinct GPU blocks (below the host part)")
    table = list(block_table[:used])
    first_own = start // block_size  # the block holding the chunk's first token
    own = table[first_own:]
    past = table[:first_own]  # whole blocks of keys older than the chunk
    own_host = [b for b in own if b >= first_host_block]
    past_host = [b for b in past if b >= first_host_block]
    room = len(scratch) - len(own_host)
    if room < 0:
        raise ValueError(
            f"the chunk writes {len(own_host)} host blocks, the scratch holds {len(scratch)}: "
            "schedule fewer tokens (chunk_tokens_that_fit)"
        )
    if not own_host and not past_host:
        return (
            StagedPass(block_table=tuple(table), seq_len=end, causal=True, copies=(), mirrors=()),
        )
    # The causal pass: every GPU block, the first host blocks of the past that fit, and
    # the chunk's own blocks last (its keys must end the sequence for the causal mask).
    in_causal = set(past_host[:room])
    causal_past = [b for b in past if b < first_host_block or b in in_causal]
    passes = [
        _pass(
            causal_past,
            own,
            first_host_block,
            scratch,
            start % block_size,
            end - first_own * block_size,
            block_size,
        )
    ]
    rest = past_host[room:]
    for at in range(0, len(rest), len(scratch)):
        window = rest[at : at + len(scratch)]
        passes.append(_pass(window, [], first_host_block, scratch, 0, 0, block_size))
    return tuple(passes)


def _pass(
    past: list[int],
    own: list[int],
    first_host_block: int,
    scratch: Sequence[int],
    own_offset: int,
    own_keys: int,
    block_size: int,
) -> StagedPass:
    """A pass over whole ``past`` blocks then the chunk's ``own`` blocks (``own_keys``
    keys, of which the first ``own_offset`` are older than the chunk), host blocks
    assigned scratch blocks in table order."""
    slots = iter(scratch)
    row, copies, mirrors = [], [], []
    for index, block in enumerate([*past, *own]):
        if block < first_host_block:
            row.append(block)
            continue
        slot = next(slots)
        row.append(slot)
        is_own = index >= len(past)
        if not is_own or (index == len(past) and own_offset):  # holds older keys
            copies.append((block, slot))
        if is_own:
            mirrors.append((block, slot))
    return StagedPass(
        block_table=tuple(row),
        seq_len=len(past) * block_size + own_keys,
        causal=bool(own),
        copies=tuple(copies),
        mirrors=tuple(mirrors),
    )


def copy_runs(copies: Sequence[BlockPair]) -> tuple[CopyRun, ...]:
    """Block copies merged where both sides are consecutive (a long request's host blocks
    mostly are: the pool hands them out in order)."""
    runs: list[CopyRun] = []
    for src, dst in copies:
        last = runs[-1] if runs else None
        if last and src == last.src + last.count and dst == last.dst + last.count:
            runs[-1] = CopyRun(src=last.src, dst=last.dst, count=last.count + 1)
        else:
            runs.append(CopyRun(src=src, dst=dst, count=1))
    return tuple(runs)


def chunk_tokens_that_fit(
    *,
    block_table: Sequence[int],
    start: int,
    new_tokens: int,
    block_size: int,
    first_host_block: int,
    scratch_blocks: int,
) -> int:
    """The most of ``new_tokens`` a chunk may take so that the host blocks it writes fit
    the scratch (the scheduler's split of a chunk). Blocks past the end of
    ``block_table`` are not allocated yet and count as host blocks (the GPU part may be
    full by then)."""
    if scratch_blocks < 1:
        raise ValueError("staging needs at least one scratch block")
    end = start + new_tokens
    host = 0
    for index in range(start // block_size, -(-end // block_size)):
        if index >= len(block_table) or block_table[index] >= first_host_block:
            host += 1
            if host > scratch_blocks:  # the chunk ends before this block
                return index * block_size - start
    return new_tokens


def scratch_blocks(
    *, spill_tokens: int, block_size: int, page_bytes: int, buffers: int = SCRATCH_BUFFERS
) -> tuple[int, int]:
    """(scratch block IDs, GPU bytes) for a chunk whose context holds ``spill_tokens``
    tokens in host blocks, staged in one pass: the IDs rounded up to whole mapping
    granules of one layer's pages (``page_bytes``: one block of one layer), the bytes
    those pages take in each of ``buffers`` buffers. 0 spilled tokens: none."""
    if spill_tokens <= 0:
        return 0, 0
    step = MAP_GRANULE // math.gcd(MAP_GRANULE, page_bytes)
    blocks = -(-spill_tokens // block_size)
    blocks = -(-blocks // step) * step
    return blocks, blocks * page_bytes * buffers


def scratch_ids(*, num_blocks: int, num_host_blocks: int, scratch_blocks: int) -> range:
    """The scratch block IDs: the last ``scratch_blocks`` of the GPU part, right before
    the host blocks (the block pool must never hand them out)."""
    first_host = num_blocks - num_host_blocks
    if not 0 < scratch_blocks < first_host:
        raise ValueError(
            f"{scratch_blocks} scratch blocks do not fit the {first_host} GPU "
            "blocks of the pool (the null block needs one)"
        )
    return range(first_host - scratch_blocks, first_host)


def scratch_ranges(
    kv_cache_config: Any, scratch: range, buffers: int = SCRATCH_BUFFERS
) -> list[tuple[int, int, int]]:
    """(start, end, buffer) byte ranges of the pool's backing allocation that hold the
    scratch blocks, one per layer, layer i (counted over all of the config's tensors) on
    physical buffer i % ``buffers``: the worker maps each range onto that buffer's
    allocation, so all layers share ``buffers`` buffers of one layer's scratch. Only
    layouts with each layer's blocks together (layer outermost) can alias per layer."""
    ranges: list[tuple[int, int, int]] = []
    for tensor in kv_cache_config.kv_cache_tensors:
        if tensor.block_stride > tensor.layer_stride:
            raise ValueError(
                "staged prefill needs a layer-outermost KV cache layout (a "
                "block-outermost one interleaves the layers of each block); "
                "unset VLLM_KV_CACHE_LAYOUT or choose LBHNC"
            )
        for layer in range(len(tensor.layers)):
            start = (
                tensor.offset + layer * tensor.layer_stride + scratch.start * tensor.block_stride
            )
            ranges.append(
                (start, start + len(scratch) * tensor.block_stride, len(ranges) % buffers)
            )
    for start, end, _ in ranges:
        if start % MAP_GRANULE or end % MAP_GRANULE:
            raise ValueError(
                f"a scratch range [{start}, {end}) is off the {MAP_GRANULE}-byte mapping granule"
            )
    return ranges
