"""Staged prefill's FlashAttention impl (vllm_ext.staged_attention, issue #41) on the CPU:
the step's rows are split between the pool and the scratch, copied, and merged back into
one output. FlashAttention's kernel needs a GPU, so here the parent's ``forward`` is a
reference paged attention in torch that reads exactly what vLLM's kernel reads (query
rows by ``query_start_loc``, ``seq_lens`` keys through ``block_table``, causal from the
bottom right); benchmarks/gpu/staged_attention_check.py runs the real kernel on both paths."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vllm_offload.vllm_ext import kv_host_mapping, staged_attention, staged_prefill

BLOCK, HEADS, KV_HEADS, DIM = 16, 4, 2, 8
NUM_BLOCKS, FIRST_HOST = 64, 40


def reference_forward(
    self: Any,
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    attn_metadata: Any,
    output: torch.Tensor,
    output_scale: Any = None,
    output_block_scale: Any = None,
) -> torch.Tensor:
    """Paged causal attention over (B, H, N, 2D) blocks, as vLLM's FlashAttention reads
    them; a row of no keys gets zeros."""
    starts = attn_metadata.query_start_loc.tolist()
    lens = attn_metadata.seq_lens.tolist()
    Reader.calls += 1
    for row in range(len(starts) - 1):
        q = query[starts[row] : starts[row + 1]]
        tokens, seq_len = q.shape[0], lens[row]
        if not tokens:
            continue
        if not seq_len:
            output[starts[row] : starts[row + 1]] = 0
            continue
        blocks = attn_metadata.block_table[row, : -(-seq_len // BLOCK)]
        kv = kv_cache[blocks.long()].permute(0, 2, 1, 3).reshape(-1, KV_HEADS, 2 * DIM)
        k, v = kv[:seq_len, :, :DIM], kv[:seq_len, :, DIM:]
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("thd,shd->hts", q, k)
        allowed = torch.arange(seq_len)[None] <= torch.arange(seq_len - tokens, seq_len)[:, None]
        scores = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        output[starts[row] : starts[row + 1]] = torch.einsum("hts,shd->thd", scores, v)
    return output


class Reader:  # the reference counts its calls
    calls = 0


@pytest.fixture
def impl(monkeypatch: pytest.MonkeyPatch) -> staged_attention.StagedFlashAttentionImpl:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    def minimal_init(self: Any, *args: Any, **kwargs: Any) -> None:
        self.num_kv_heads, self.head_size, self.kv_cache_dtype = KV_HEADS, DIM, "auto"
        self.attn_type = "decoder"

    scratch = torch.full((20 * KV_HEADS * BLOCK * 2 * DIM * 4,), 7, dtype=torch.int8)
    monkeypatch.setattr(FlashAttentionImpl, "__init__", minimal_init)
    monkeypatch.setattr(FlashAttentionImpl, "forward", reference_forward)
    monkeypatch.setattr(staged_attention, "_reserve_scratch", lambda *a: scratch)
    monkeypatch.setitem(kv_host_mapping._SPLITS, 0, (NUM_BLOCKS, FIRST_HOST))
    # A pool of 1,024 tokens: every step here may stage (the gate: test_staged_prefill).
    monkeypatch.setattr(staged_prefill, "MIN_STAGED_CONTEXT_TOKENS", 0)
    made = staged_attention.StagedFlashAttentionImpl()
    made.dcp_world_size = 1
    Reader.calls = 0
    return made


def metadata(rows: list[tuple[int, int, list[int]]]) -> Any:
    """FlashAttention's metadata for (new tokens, keys, block table) rows."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    starts = [0]
    for tokens, _, _ in rows:
        starts.append(starts[-1] + tokens)
    width = max(len(t) for *_, t in rows)
    return FlashAttentionMetadata(
        num_actual_tokens=starts[-1],
        max_query_len=max(t for t, _, _ in rows),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        max_seq_len=max(s for _, s, _ in rows),
        seq_lens=torch.tensor([s for _, s, _ in rows], dtype=torch.int32),
        block_table=torch.tensor([t + [0] * (width - len(t)) for *_, t in rows], dtype=torch.int32),
        slot_mapping=torch.zeros(starts[-1], dtype=torch.int64),
    )


def forward_both(
    impl: staged_attention.StagedFlashAttentionImpl, meta: Any, kv_cache: torch.Tensor | None = None
) -> Any:
    """The staged impl's output equals the reference's on the pool, bit for bit; the
    step's staging, as the impl kept it."""
    query = torch.randn(int(meta.num_actual_tokens), HEADS, DIM)
    if kv_cache is None:
        kv_cache = torch.randn(NUM_BLOCKS, KV_HEADS, BLOCK, 2 * DIM)
    expected = reference_forward(
        None, None, query, query, query, kv_cache, meta, torch.empty_like(query)
    )
    got = torch.full_like(query, float("nan"))
    impl.forward(None, query, query, query, kv_cache, meta, got)  # type: ignore[arg-type]
    assert torch.equal(got, expected)
    return meta.__dict__.get(staged_attention._STEP_ATTR)


# A decode row reaching host blocks, a prefill reaching host blocks (staged), a prefill on
# GPU blocks, a prefill longer than the scratch's 20 blocks (in place), in one step.
ROWS = [
    (1, 100, [1, 2, 3, 4, 41, 42, 43]),
    (200, 230, [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 44, 45, 46, 47, 48]),
    (150, 150, [15, 16, 17, 18, 19, 20, 21, 22, 23, 24]),
    (130, 340, [25, 26, 27, 28, 29, 30, *range(49, 64), 31]),
]


def test_a_step_with_staged_and_in_place_rows_equals_the_pool(
    impl: staged_attention.StagedFlashAttentionImpl,
) -> None:
    """Every row's output equals attention on the pool, bit for bit, the staged row's
    through the scratch; the step is planned once for all layers (two layers here), and
    the scratch (full of stale bytes) is read only where the copies wrote."""
    torch.manual_seed(0)
    meta = metadata(ROWS)
    for _ in range(2):  # two layers
        step = forward_both(impl, meta)
    assert [r.staged.row for r in step.rows] == [1]
    assert step.rows[0].metadata.scheduler_metadata is None  # planned for the whole batch
    assert step.rest is not None and step.rest.seq_lens.tolist() == [100, 0, 150, 340]
    assert Reader.calls == 2 * (1 + 2)  # per layer: the reference, the rest, the staged row


def test_a_step_of_one_staged_row_runs_one_kernel_over_the_scratch_on_its_schedule(
    impl: staged_attention.StagedFlashAttentionImpl,
) -> None:
    torch.manual_seed(1)
    meta = metadata([ROWS[1]])
    meta.scheduler_metadata = torch.zeros(4, dtype=torch.int32)  # the builder's, for this row
    step = forward_both(impl, meta)
    assert step.rest is None
    own = step.rows[0].metadata  # the builder's, but for the table
    assert own.scheduler_metadata is meta.scheduler_metadata
    assert (own.max_seq_len, own.block_table.shape) == (meta.max_seq_len, meta.block_table.shape)
    assert Reader.calls == 2


def test_a_padded_step_of_one_staged_row_keeps_the_batch_shape(
    impl: staged_attention.StagedFlashAttentionImpl,
) -> None:
    """A row of no query token (a padded batch) beside the staged row: one kernel call
    over the whole batch, the staged row's table pointing into the scratch."""
    torch.manual_seed(3)
    meta = metadata([(0, 0, [0]), ROWS[1]])
    (row,) = forward_both(impl, meta).rows
    assert row.metadata.block_table[0].tolist() == meta.block_table[0].tolist()


def test_a_fragmented_row_is_copied_by_one_gather(
    impl: staged_attention.StagedFlashAttentionImpl,
) -> None:
    """Blocks in more runs than MAX_RUNS: one index_select instead of a copy per run."""
    torch.manual_seed(2)
    table = [*range(1, 36, 2), 41, 43]  # 20 runs of one block
    (row,) = forward_both(impl, metadata([(200, 20 * BLOCK, table)])).rows
    assert row.gather is not None and len(row.staged.runs) > staged_attention.MAX_RUNS


def test_decode_steps_and_engines_without_an_extension_are_flashattention_as_is(
    impl: staged_attention.StagedFlashAttentionImpl, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decode-only step reads nothing back (its full CUDA graph must not sync); an
    engine whose pool has no host part plans nothing."""
    meta = metadata([ROWS[0]])
    forward_both(impl, meta)
    assert staged_attention._STEP_ATTR not in meta.__dict__
    monkeypatch.delitem(kv_host_mapping._SPLITS, 0)
    assert forward_both(impl, metadata([ROWS[1]])) is None


def test_the_plugin_puts_the_staged_backend_in_flashattentions_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.v1.attention.backends import registry

    from vllm_offload.vllm_ext import plugin
    from vllm_offload.vllm_ext.knobs import STAGED_PREFILL_ENV

    monkeypatch.setattr(registry, "_ATTN_OVERRIDES", dict(registry._ATTN_OVERRIDES))
    plugin.register()
    assert registry.AttentionBackendEnum.FLASH_ATTN.get_class().__name__ == "FlashAttentionBackend"
    monkeypatch.setenv(STAGED_PREFILL_ENV, "1")
    plugin.register()
    backend = registry.AttentionBackendEnum.FLASH_ATTN.get_class()
    assert backend is staged_attention.StagedFlashAttentionBackend
    assert backend.get_impl_cls() is staged_attention.StagedFlashAttentionImpl
