"""Staged prefill on vLLM's FlashAttention backend (issue #41): the same backend, whose
impl copies a spilled request's context into GPU scratch once per layer before the
kernel reads it, instead of letting the kernel read the host blocks in place once per
query tile. The plugin puts this class in FLASH_ATTN's place (``register_backend``, an
extension point: no hunk) when the launcher asks for it (``STAGED_PREFILL_ENV``).

Per step with a long enough prefill and context (``staged_prefill.step_may_stage``), the
first layer reads back the batch's query and key counts and the candidate rows' block tables
(one sync, on such steps only) and picks the rows that reach host blocks
(``staged_prefill.stage_rows``); every layer then copies those rows' blocks into the
scratch (a few memcpys: a long request's blocks are mostly consecutive), runs the
unchanged kernel once over the other rows (the staged rows' key counts set to 0) and once
per staged row over the scratch. Same keys, same order, same kernel: the output equals the
pool's. Decode-only steps (vLLM's full CUDA graphs) run FlashAttention as is.

The scratch is one buffer per GPU shared by all layers (each layer's copy follows the
previous layer's kernel on the same stream), of ``--additional-config
kv_staging_tokens`` tokens of one layer, allocated while vLLM builds the model so that its
memory profile counts it (the planner took it from the pool: plan/staging.py). Runs inside
vLLM's engine core; imports vLLM's FlashAttention backend (CUDA builds only).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import get_current_vllm_config_or_none
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
)

from vllm_offload.vllm_ext import knobs, kv_host_mapping, staged_prefill
from vllm_offload.vllm_ext.knobs import STAGING_TOKENS_KEY

# A row whose blocks fall in more runs than this is copied by one gather per layer.
MAX_RUNS = 16
# Where a step's staging is kept, on the metadata object every layer of the step shares.
_STEP_ATTR = "_vllm_offload_staged_step"
# One scratch per GPU, shared by the layers (and by the impls of one engine).
_SCRATCH: dict[int, torch.Tensor] = {}


@dataclass(frozen=True, kw_only=True)
class _Row:
    """A staged row and what its kernel call and copies need on the device."""

    staged: staged_prefill.StagedRow
    metadata: FlashAttentionMetadata
    queries: slice  # its rows of the step's query and output
    runs: tuple[staged_prefill.CopyRun, ...]
    gather: torch.Tensor | None  # its pool blocks, when copied by one gather


@dataclass(frozen=True, kw_only=True)
class _Step:
    rows: tuple[_Row, ...]
    rest: FlashAttentionMetadata | None  # the other rows, or None when there are none


def staging_tokens(vllm_config: Any) -> int:
    return knobs.whole_number(vllm_config, STAGING_TOKENS_KEY, "tokens")


def _reserve_scratch(num_kv_heads: int, head_size: int, kv_cache_dtype: str) -> torch.Tensor | None:
    vllm_config = get_current_vllm_config_or_none()
    tokens = staging_tokens(vllm_config)
    if not tokens:
        return None
    assert vllm_config is not None
    dtype = kv_cache_dtype_str_to_dtype(kv_cache_dtype, vllm_config.model_config)
    nbytes = tokens * num_kv_heads * 2 * head_size * dtype.itemsize
    device = torch.cuda.current_device()
    if device not in _SCRATCH or _SCRATCH[device].numel() < nbytes:
        _SCRATCH[device] = torch.empty(nbytes, dtype=torch.int8, device=f"cuda:{device}")
    return _SCRATCH[device]


def _tensor(values: list[Any], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)


def _scratch_like(scratch: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
    """The scratch's bytes as whole blocks shaped like the pool's."""
    blocks = scratch.numel() // (kv_cache[0].numel() * kv_cache.element_size())
    elements = scratch.view(kv_cache.dtype)[: blocks * kv_cache[0].numel()]
    return elements.view(blocks, *kv_cache.shape[1:])


def _plan_step(
    meta: FlashAttentionMetadata, kv_cache: torch.Tensor, scratch: torch.Tensor
) -> _Step | None:
    """This step's staging, or None (nothing reaches host blocks, or no extension)."""
    split = kv_host_mapping.pool_split(kv_cache.device)
    if split is None:
        return None
    num_blocks, first_host = split
    ratio = kv_cache.shape[0] // num_blocks  # kernel blocks per pool block
    block_size = kv_cache.shape[2]
    capacity = len(_scratch_like(scratch, kv_cache))
    query_start_loc = meta.query_start_loc.tolist()  # the sync, on steps that may stage
    seq_lens = meta.seq_lens.tolist()[: len(query_start_loc) - 1]
    rows = staged_prefill.rows_worth_reading(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_size=block_size,
        scratch_blocks=capacity,
    )
    if not rows:
        return None
    width = max(-(-seq_lens[row] // block_size) for row in rows)
    device = meta.block_table.device
    read = meta.block_table[torch.tensor(rows, device=device), :width].tolist()
    staged = staged_prefill.stage_rows(
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        tables=dict(zip(rows, read, strict=True)),
        block_size=block_size,
        first_host_block=first_host * ratio,
        scratch_blocks=capacity,
    )
    if not staged:
        return None
    done = {row.row for row in staged}
    rest = None
    if any(
        query_start_loc[row + 1] > query_start_loc[row] and row not in done
        for row in range(len(seq_lens))
    ):  # the staged rows attend to no key of the pool: their rows of it are rewritten
        rest = copy.copy(meta)
        rest.seq_lens = meta.seq_lens.clone()
        rest.seq_lens[torch.tensor(sorted(done), device=device)] = 0
        rest.scheduler_metadata = None  # planned for the key counts above
    alone = rest is None and len(staged) == 1
    return _Step(rows=tuple(_row(meta, row, alone) for row in staged), rest=rest)


def _row(meta: FlashAttentionMetadata, row: staged_prefill.StagedRow, alone: bool) -> _Row:
    """The row's kernel call over the scratch. A step of this one row keeps every field
    of the builder's metadata but the block table (the same upper bounds and the same
    ahead-of-time schedule: the kernel splits the work the same way, so the sums round
    the same); in a step of several rows the row gets its own counts and no schedule."""
    own = copy.copy(meta)
    width = meta.block_table.shape[1]
    scratch_row = _tensor(
        [[*row.scratch_table, *[0] * (width - len(row.blocks))]], meta.block_table
    )
    queries = slice(None)
    if alone:  # the batch's other rows (if any) have no query token
        own.block_table = meta.block_table.clone()
        own.block_table[row.row] = scratch_row[0]
    else:
        tokens = row.query_end - row.query_start
        queries = slice(row.query_start, row.query_end)
        own.block_table = scratch_row
        own.num_actual_tokens = own.max_query_len = tokens
        own.query_start_loc = _tensor([0, tokens], meta.query_start_loc)
        own.max_seq_len = row.seq_len
        own.seq_lens = _tensor([row.seq_len], meta.seq_lens)
        own.scheduler_metadata = None
    runs, gather = row.runs, None
    if len(runs) > MAX_RUNS:
        gather = torch.tensor(row.blocks, device=meta.block_table.device)
    return _Row(staged=row, metadata=own, queries=queries, runs=runs, gather=gather)


def _copy_row(row: _Row, kv_cache: torch.Tensor, scratch: torch.Tensor) -> None:
    staged = row.staged
    if row.gather is not None:
        start, count = staged.scratch_start, len(staged.blocks)
        torch.index_select(kv_cache, 0, row.gather, out=scratch[start : start + count])
        return
    for run in row.runs:
        scratch[run.dst : run.dst + run.count].copy_(kv_cache[run.src : run.src + run.count])


class StagedFlashAttentionImpl(FlashAttentionImpl):
    """FlashAttention whose prefill of a spilled request reads its context from the
    scratch (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scratch = (
            _reserve_scratch(self.num_kv_heads, self.head_size, self.kv_cache_dtype)
            if self.attn_type == AttentionType.DECODER
            else None
        )

    def _step(self, meta: Any, kv_cache: torch.Tensor) -> _Step | None:
        if (
            self._scratch is None
            or meta is None
            or not staged_prefill.step_may_stage(
                max_query_len=meta.max_query_len, max_seq_len=meta.max_seq_len
            )
            or self.dcp_world_size > 1
            or meta.causal is not True
            or meta.mm_prefix_query_range_tensor is not None
            or meta.rswa_prefix_lens is not None
            or (kv_cache.is_cuda and torch.cuda.is_current_stream_capturing())  # no sync in a graph
        ):
            return None
        if _STEP_ATTR not in meta.__dict__:
            setattr(meta, _STEP_ATTR, _plan_step(meta, kv_cache, self._scratch))
        step: _Step | None = getattr(meta, _STEP_ATTR)
        return step

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: FlashAttentionMetadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        step = self._step(attn_metadata, kv_cache)
        if step is None:
            return super().forward(
                layer,
                query,
                key,
                value,
                kv_cache,
                attn_metadata,
                output,
                output_scale,
                output_block_scale,
            )
        assert self._scratch is not None
        scratch = _scratch_like(self._scratch, kv_cache)
        if step.rest is not None:
            super().forward(layer, query, key, value, kv_cache, step.rest, output)
        for row in step.rows:
            _copy_row(row, kv_cache, scratch)
            rows = row.queries
            super().forward(layer, query[rows], key, value, scratch, row.metadata, output[rows])
        return output


class StagedFlashAttentionBackend(FlashAttentionBackend):
    """vLLM's FlashAttention backend with ``StagedFlashAttentionImpl``."""

    @staticmethod
    def get_impl_cls() -> type[StagedFlashAttentionImpl]:
        return StagedFlashAttentionImpl
