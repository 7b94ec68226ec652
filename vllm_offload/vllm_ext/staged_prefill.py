"""Staged prefill (issue #41): which prefilling requests of a step copy their context into
GPU scratch before each layer's attention, and where, so that a request whose KV reaches
the host extension (patch 0006) reads its host blocks over PCIe once per layer and chunk
instead of once per query tile of the kernel (40x slower for an 8k chunk: 942 ms against
23.5 ms for one layer of the 8B shape, docs/design/long-context.md).

A staged row's blocks (GPU and host, in order) are copied into consecutive scratch
blocks, and the kernel reads that row from the scratch through the table
``scratch_start, scratch_start + 1, ...``: the same keys in the same order as in the pool.
Rows with fewer than ``MIN_QUERY_TOKENS`` new tokens (decodes) keep reading in place: a
few passes over their host blocks, about what a copy would cost; so do the rows of a step
whose contexts are all short (``step_may_stage``: no read-back). A row whose context
outgrows the scratch left over reads in place too (exact, slow).

Pure functions of token counts and block IDs, no vLLM or torch: ``staged_attention``
calls ``step_may_stage``, then ``rows_worth_reading`` and ``stage_rows`` once per step,
the planner ``scratch_bytes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# FlashAttention 3 reads the keys once per 128-row query tile, 32 tokens of 4 grouped heads
# for the 8B shape (docs/design/long-context.md): a row of fewer query tokens reads its
# host blocks at most 4 times, not worth a step's read-back.
MIN_QUERY_TOKENS = 128
# The shortest context of a step worth reading its rows back for. Picking the rows takes a
# read-back (one sync), so the step's launch waits for the step in flight, whose output
# waits for that launch: every chat's token of it came late (issue #54, fair10: chats'
# own 256-token prompts). A row of a shorter context read in place passes over at most
# 512 tokens of host blocks 16 times a layer (~2 MiB each for the 8B shape: ~0.6 ms a
# layer at 52 GB/s), and only where a short request holds host blocks at all.
MIN_STAGED_CONTEXT_TOKENS = 512


@dataclass(frozen=True, kw_only=True)
class CopyRun:
    """``count`` consecutive blocks from pool block ``src`` to scratch block ``dst``: one
    copy per layer and run."""

    src: int
    dst: int
    count: int


@dataclass(frozen=True, kw_only=True)
class StagedRow:
    """A prefilling row of the step's batch that reads its context from the scratch.

    ``row``: its index in the batch; ``query_start``/``query_end``: its tokens in the
    step's flattened query; ``seq_len``: the keys it attends to; ``blocks``: the pool
    blocks that hold them, in order, copied to ``scratch_start`` onwards."""

    row: int
    query_start: int
    query_end: int
    seq_len: int
    blocks: tuple[int, ...]
    scratch_start: int

    @property
    def scratch_table(self) -> range:
        """The row's block table in the scratch."""
        return range(self.scratch_start, self.scratch_start + len(self.blocks))

    @property
    def runs(self) -> tuple[CopyRun, ...]:
        return copy_runs(list(zip(self.blocks, self.scratch_table, strict=True)))


def copy_runs(pairs: Sequence[tuple[int, int]]) -> tuple[CopyRun, ...]:
    """(src, dst) block copies merged where both sides are consecutive (a long request's
    blocks mostly are: the pool hands them out in order)."""
    runs: list[CopyRun] = []
    src = dst = count = 0
    for next_src, next_dst in pairs:
        if count and next_src == src + count and next_dst == dst + count:
            count += 1
            continue
        if count:
            runs.append(CopyRun(src=src, dst=dst, count=count))
        src, dst, count = next_src, next_dst, 1
    if count:
        runs.append(CopyRun(src=src, dst=dst, count=count))
    return tuple(runs)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def step_may_stage(*, max_query_len: int, max_seq_len: int) -> bool:
    """Whether any row of a step may be worth staging, from what the CPU knows of it
    (vLLM's largest query and key counts): otherwise no row is read back."""
    return max_query_len >= MIN_QUERY_TOKENS and max_seq_len >= MIN_STAGED_CONTEXT_TOKENS


def rows_worth_reading(
    *,
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    block_size: int,
    scratch_blocks: int,
) -> list[int]:
    """The rows whose block table the caller reads back to ``stage_rows``: enough query
    tokens to gain from staging, and a context the scratch can hold."""
    return [
        row
        for row, seq_len in enumerate(seq_lens)
        if query_start_loc[row + 1] - query_start_loc[row] >= MIN_QUERY_TOKENS
        and 0 < _blocks(seq_len, block_size) <= scratch_blocks
    ]


def stage_rows(
    *,
    query_start_loc: Sequence[int],
    seq_lens: Sequence[int],
    tables: Mapping[int, Sequence[int]],
    block_size: int,
    first_host_block: int,
    scratch_blocks: int,
) -> tuple[StagedRow, ...]:
    """The rows of ``tables`` (row -> its block table, at least its used blocks) that
    reach a host block, each given the next scratch blocks while they last, in row
    order; the others read the pool in place."""
    staged: list[StagedRow] = []
    at = 0
    for row in sorted(tables):
        used = _blocks(seq_lens[row], block_size)
        blocks = tuple(tables[row][:used])
        if len(blocks) < used:
            raise ValueError(f"row {row}: {len(blocks)} blocks for {seq_lens[row]} keys")
        if not any(block >= first_host_block for block in blocks) or at + used > scratch_blocks:
            continue
        staged.append(
            StagedRow(
                row=row,
                query_start=query_start_loc[row],
                query_end=query_start_loc[row + 1],
                seq_len=seq_lens[row],
                blocks=blocks,
                scratch_start=at,
            )
        )
        at += used
    return tuple(staged)


def scratch_bytes(*, tokens: int, block_size: int, page_bytes: int) -> int:
    """GPU bytes of a scratch that holds ``tokens`` of context of one layer (whole blocks
    of ``page_bytes``: one block of one layer's K and V)."""
    return _blocks(max(tokens, 0), block_size) * page_bytes
