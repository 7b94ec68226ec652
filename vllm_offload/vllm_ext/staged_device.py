"""Staged prefill's block-table rewrite on the device (issue #41): vLLM 0.32's attention
metadata carries the block table on the GPU only, so reading it back to run
``staged_prefill.stage_chunk`` would stall every step that stages. This computes the
single-pass rewrite with tensor ops instead, where the table lives: a host block's
scratch slot is its rank among the staged rows' host blocks (a cumulative sum), and the
(host block, scratch block) pairs feed a gather that reads the host blocks through the
pool's mapping. Same result as ``stage_chunk``'s one pass, row after row (the tests hold
them equal); when the staged rows' host blocks outnumber the scratch the caller falls
back to ``stage_chunk``'s split passes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def rewrite_rows(
    block_table: torch.Tensor,
    blocks_per_row: torch.Tensor,
    staged: torch.Tensor,
    first_host_block: int,
    scratch: range,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewritten table, host block IDs, their scratch IDs, host blocks needed).

    ``block_table`` (rows, width) int32; ``blocks_per_row`` (rows,) the blocks each row's
    context uses (the rest is padding); ``staged`` (rows,) bool, the prefilling rows to
    stage (decode rows keep reading in place). Host blocks of staged rows are numbered in
    row-major order onto ``scratch``; the pairs are only the first ``len(scratch)``, and
    the table is valid only when the count returned is <= len(scratch) (the caller checks
    it with the one number it reads back, or sizes the scratch so that it always is)."""
    import torch

    width = block_table.shape[1]
    used = torch.arange(width, device=block_table.device)[None] < blocks_per_row[:, None]
    host = (block_table >= first_host_block) & used & staged[:, None]
    rank = torch.cumsum(host.flatten().to(torch.int64), 0).view_as(host) - 1
    slots = (rank + scratch.start).to(block_table.dtype)
    table = torch.where(host & (rank < len(scratch)), slots, block_table)
    fits = host & (rank < len(scratch))
    return table, block_table[fits], slots[fits], host.sum()
