"""Staged prefill's choice of rows and their copies (vllm_ext.staged_prefill, issue #41) on
block tables made by vLLM's own BlockPool with patch 0006's host extension (GPU blocks
handed out first, then host blocks): what the kernel reads through a staged row's scratch
table, after its copies into a scratch full of stale data, must be the row's context in
the pool. The kernel itself needs a GPU: benchmarks/gpu/staged_attention_check.py runs
vLLM's FlashAttention on both paths there."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_offload.vllm_ext import staged_prefill
from vllm_offload.vllm_ext.staged_prefill import MIN_QUERY_TOKENS, StagedRow

STALE = -1  # what a scratch slot holds before the copies: another layer's keys


@dataclass(frozen=True, kw_only=True)
class Batch:
    """One step: each row's block table from vLLM's BlockPool, its new tokens, its keys."""

    tables: list[list[int]]
    query_lens: list[int]
    seq_lens: list[int]
    block_size: int
    first_host_block: int
    scratch_blocks: int

    @property
    def query_start_loc(self) -> list[int]:
        return [0, *itertools.accumulate(self.query_lens)]


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    from vllm.v1.core.block_pool import BlockPool

    block_size = draw(st.sampled_from([4, 16, 32]))
    gpu, host = draw(st.integers(4, 40)), draw(st.integers(1, 40))
    pool = BlockPool(
        num_gpu_blocks=gpu + host,
        enable_caching=False,
        hash_block_size=block_size,
        num_host_blocks=host,
    )
    tables, query_lens, seq_lens = [], [], []
    for _ in range(draw(st.integers(1, 4))):
        free = pool.get_num_free_blocks()
        if not free:
            break
        blocks = draw(st.integers(1, free))
        tables.append([b.block_id for b in pool.get_new_blocks(blocks)])
        seq_len = draw(st.integers((blocks - 1) * block_size + 1, blocks * block_size))
        decode = draw(st.booleans())
        query_lens.append(1 if decode else draw(st.integers(100, 300)))
        seq_lens.append(max(seq_len, query_lens[-1]))
        if seq_lens[-1] > blocks * block_size:  # more new tokens than the blocks hold
            query_lens[-1] = seq_lens[-1] = seq_len
    return Batch(
        tables=tables,
        query_lens=query_lens,
        seq_lens=seq_lens,
        block_size=block_size,
        first_host_block=gpu,
        scratch_blocks=draw(st.integers(1, gpu + host)),
    )


def stage(batch: Batch) -> tuple[StagedRow, ...]:
    rows = staged_prefill.rows_worth_reading(
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_size=batch.block_size,
        scratch_blocks=batch.scratch_blocks,
    )
    return staged_prefill.stage_rows(
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        tables={row: batch.tables[row] for row in rows},
        block_size=batch.block_size,
        first_host_block=batch.first_host_block,
        scratch_blocks=batch.scratch_blocks,
    )


@settings(max_examples=300, deadline=None)
@given(batches())
def test_a_staged_row_reads_its_context_through_the_scratch(batch: Batch) -> None:
    """The pool holds key p of row r at (table[p // bs], p % bs); the scratch starts stale,
    gets every staged row's copy runs, and the kernel reads each staged row through its
    scratch table: exactly the row's keys, in order. Staged rows never share a scratch
    block, and the ones left out read in place for a reason: a short query, no host
    block, or no scratch left."""
    bs = batch.block_size
    pool = {}
    for row, table in enumerate(batch.tables):
        for position in range(batch.seq_lens[row]):
            pool[table[position // bs], position % bs] = (row, position)
    staged = stage(batch)
    scratch = {(b, o): STALE for b in range(batch.scratch_blocks) for o in range(bs)}
    for row in staged:
        for run in row.runs:
            for i in range(run.count):
                for o in range(bs):
                    if (run.src + i, o) in pool:
                        scratch[run.dst + i, o] = pool[run.src + i, o]
    taken: set[int] = set()
    for row in staged:
        assert taken.isdisjoint(row.scratch_table)
        taken |= set(row.scratch_table)
        table = list(row.scratch_table)
        keys = [scratch[table[p // bs], p % bs] for p in range(row.seq_len)]
        assert keys == [(row.row, p) for p in range(batch.seq_lens[row.row])]
        assert (row.query_start, row.query_end) == tuple(
            batch.query_start_loc[row.row : row.row + 2]
        )
    done = {row.row for row in staged}
    for index, table in enumerate(batch.tables):
        if index in done:
            continue
        used = table[: -(-batch.seq_lens[index] // bs)]
        assert (
            batch.query_lens[index] < MIN_QUERY_TOKENS
            or all(b < batch.first_host_block for b in used)
            or len(used) > batch.scratch_blocks - len(taken)
        )


def test_decode_rows_and_rows_on_gpu_blocks_read_in_place() -> None:
    """A decode row (one new token) never stages, nor does a prefill whose blocks are
    all GPU blocks; a prefill reaching one host block stages all of its blocks."""
    first_host = 100
    staged = staged_prefill.stage_rows(
        query_start_loc=[0, 1, 201, 401],
        seq_lens=[50, 300, 300],
        tables={1: [1, 2, 3, 4, 5], 2: [6, 7, 100, 101, 102, 103]},
        block_size=64,
        first_host_block=first_host,
        scratch_blocks=64,
    )
    assert [(r.row, r.blocks, r.scratch_table) for r in staged] == [
        (2, (6, 7, 100, 101, 102), range(0, 5))
    ]
    assert (
        staged_prefill.rows_worth_reading(
            query_start_loc=[0, 1, 201, 401],
            seq_lens=[50, 300, 300],
            block_size=64,
            scratch_blocks=4,
        )
        == []
    )  # each prefill needs 5 blocks: longer than the scratch, they read in place


def test_a_step_of_short_contexts_reads_no_row_back() -> None:
    """Issue #54, fair10: picking the rows to stage reads the step's counts and tables
    back (one sync), which held the step in flight's output for chats' own prompts. A
    step whose contexts are all short, or whose rows all decode, reads none back."""
    may_stage = staged_prefill.step_may_stage
    assert may_stage(max_query_len=256, max_seq_len=60_000)
    assert may_stage(max_query_len=128, max_seq_len=512)
    assert not may_stage(max_query_len=256, max_seq_len=511)  # chats' prompts of 256
    assert not may_stage(max_query_len=127, max_seq_len=60_000)  # decodes


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=12))
def test_copy_runs_merge_consecutive_pairs_and_only_those(pairs: list[tuple[int, int]]) -> None:
    runs = staged_prefill.copy_runs(pairs)
    assert [(r.src + i, r.dst + i) for r in runs for i in range(r.count)] == pairs
    for a, b in itertools.pairwise(runs):
        assert (b.src, b.dst) != (a.src + a.count, a.dst + a.count)


def test_the_scratch_for_the_8b_shape_at_65536_tokens() -> None:
    """65,536 tokens of one layer of the 8B shape (16-token blocks of 64 KiB): 256 MiB;
    a token more takes a whole block more."""
    page = 16 * 8 * 128 * 2 * 2
    assert staged_prefill.scratch_bytes(tokens=65536, block_size=16, page_bytes=page) == 256 << 20
    assert staged_prefill.scratch_bytes(tokens=65537, block_size=16, page_bytes=page) == (
        (256 << 20) + page
    )
    assert staged_prefill.scratch_bytes(tokens=0, block_size=16, page_bytes=page) == 0


@pytest.mark.usefixtures("as_cuda")
@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC"])
def test_a_long_request_through_vllms_scheduler_stages_every_chunk_that_spills(
    demo_dir: Path, layout: str
) -> None:
    """vLLM's own Scheduler, chunked prefill of 1,024 tokens, on a pool patch 0006 sizes
    (256 GPU blocks, then 256 host blocks): every chunk whose context reaches a host
    block stages, in one scratch of the request's length, with a few copy runs (the pool
    hands its blocks out in order), and the chunks before it read in place."""
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.vllm_patches.test_host_extension import HOST_BYTES, config
    from tests.vllm_patches.test_kv_offload_capacity import BYTES_PER_BLOCK, kv_configs

    bs, prompt_tokens, chunk = 16, 8000, 1024
    vllm_config = config(demo_dir, 8176, HOST_BYTES, layout)
    vllm_config.scheduler_config.max_num_batched_tokens = chunk
    (kv_config,) = kv_configs(vllm_config, 256 * BYTES_PER_BLOCK)
    first_host = kv_config.num_blocks - kv_config.num_host_blocks
    assert (first_host, kv_config.num_host_blocks) == (256, 256)
    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    scheduler = Scheduler(
        vllm_config, kv_config, StructuredOutputManager(vllm_config), block_size=bs
    )
    kv_cache_utils.init_none_hash(sha256)
    request = Request(
        "r",
        list(range(1, prompt_tokens + 1)),
        SamplingParams(max_tokens=2, ignore_eos=True),
        None,
        block_hasher=kv_cache_utils.get_request_block_hasher(bs, sha256),
    )
    scheduler.add_request(request)
    scratch_blocks = -(-prompt_tokens // bs)
    gpu_tokens = (first_host - 1) * bs  # the null block
    staged_steps, in_place_steps = 0, 0
    while request.num_computed_tokens < prompt_tokens:
        start = request.num_computed_tokens
        output = scheduler.schedule()
        new = output.num_scheduled_tokens["r"]
        (table,) = scheduler.kv_cache_manager.get_block_ids("r")
        (row,) = staged_prefill.stage_rows(
            query_start_loc=[0, new],
            seq_lens=[start + new],
            tables={0: table},
            block_size=bs,
            first_host_block=first_host,
            scratch_blocks=scratch_blocks,
        ) or (None,)
        if start + new > gpu_tokens:
            assert row is not None and row.scratch_start == 0
            assert len(row.runs) <= 2  # the GPU blocks, then the host blocks
            staged_steps += 1
        else:
            assert row is None
            in_place_steps += 1
        done = start + new >= prompt_tokens
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=["r"], req_id_to_index={"r": 0}, sampled_token_ids=[[7] if done else []]
            ),
        )
    assert staged_steps + in_place_steps == -(-prompt_tokens // chunk)
    assert staged_steps == -(-(prompt_tokens - gpu_tokens) // chunk) + (gpu_tokens % chunk > 0)
