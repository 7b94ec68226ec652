"""Staged prefill's block-table rewrite (vllm_ext.staged_prefill, issue #41) on block
tables made by vLLM's own BlockPool with patch 0006's host extension (GPU blocks handed
out first, then host blocks), against a pool simulated in token positions: what the
kernel reads through each rewritten row, after the copies and mirrors into a scratch
full of stale data, must be the chunk's context. The copy engine and the kernels need a
GPU: benchmarks/long_context/staged_prefill_probe.py runs them there."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_offload.vllm_ext import staged_prefill
from vllm_offload.vllm_ext.staged_prefill import StagedPass, stage_chunk

STALE = -1  # what a scratch slot holds before a pass's copies: another layer's keys


@dataclass(frozen=True, kw_only=True)
class Case:
    """A request's row from vLLM's BlockPool, the chunk, and the scratch."""

    table: list[int]
    start: int
    new_tokens: int
    block_size: int
    first_host_block: int
    scratch: list[int]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    from vllm.v1.core.block_pool import BlockPool

    block_size = draw(st.sampled_from([1, 4, 16]))
    gpu, host = draw(st.integers(4, 24)), draw(st.integers(1, 24))
    scratch_n = draw(st.integers(1, 6))
    pool = BlockPool(
        num_gpu_blocks=gpu + host,
        enable_caching=False,
        hash_block_size=block_size,
        num_host_blocks=host,
    )
    first_host = gpu
    # the scratch: GPU blocks the pool handed out for good (the engine keeps them back)
    scratch = [b.block_id for b in pool.get_new_blocks(min(scratch_n, gpu - 2))]
    other = draw(st.integers(0, gpu - 2 - len(scratch)))
    pool.get_new_blocks(other)  # another request's blocks: the GPU part fills sooner
    free = pool.get_num_free_blocks()
    blocks = draw(st.integers(1, free))
    table = [b.block_id for b in pool.get_new_blocks(blocks)]
    end = draw(st.integers(1, blocks * block_size))
    start = draw(st.integers(0, end - 1))
    return Case(
        table=table,
        start=start,
        new_tokens=end - start,
        block_size=block_size,
        first_host_block=first_host,
        scratch=scratch,
    )


def run_passes(case: Case) -> list[tuple[StagedPass, list[int]]]:
    """Each pass and the key positions its kernel reads: the pool holds position p of
    the request at (table[p // bs], p % bs); a pass's scratch starts stale, gets its
    copies, then the chunk writes its tokens through the original slots and, for its
    mirrored blocks, into the scratch."""
    bs = case.block_size
    end = case.start + case.new_tokens
    pool: dict[tuple[int, int], int] = {}
    for position in range(case.start):  # earlier steps wrote these
        pool[case.table[position // bs], position % bs] = position
    passes = stage_chunk(
        block_table=case.table,
        start=case.start,
        new_tokens=case.new_tokens,
        block_size=bs,
        first_host_block=case.first_host_block,
        scratch=case.scratch,
    )
    for position in range(case.start, end):  # this step's K/V, through the slot mapping
        pool[case.table[position // bs], position % bs] = position
    read = []
    for staged in passes:
        scratch = {(slot, o): STALE for slot in case.scratch for o in range(bs)}
        for src, dst in staged.copies:
            for o in range(bs):
                if (src, o) in pool and pool[src, o] < case.start:
                    scratch[dst, o] = pool[src, o]
        mirrored = dict(staged.mirrors)
        for position in range(case.start, end):
            block = case.table[position // bs]
            if block in mirrored:
                scratch[mirrored[block], position % bs] = position
        keys = []
        for index in range(staged.seq_len):
            block, offset = staged.block_table[index // bs], index % bs
            keys.append(scratch[block, offset] if block in case.scratch else pool[block, offset])
        read.append((staged, keys))
    return read


@settings(max_examples=300, deadline=None)
@given(cases())
def test_each_pass_reads_the_chunks_context_through_gpu_blocks_only(case: Case) -> None:
    end = case.start + case.new_tokens
    own_host = {case.table[p // case.block_size] for p in range(case.start, end)}
    own_host = {b for b in own_host if b >= case.first_host_block}
    if len(own_host) > len(case.scratch):
        with pytest.raises(ValueError, match="schedule fewer tokens"):
            run_passes(case)
        return
    read = run_passes(case)
    causal = [keys for staged, keys in read if staged.causal]
    assert len(causal) == 1 and read[0][0].causal
    # the causal pass ends with the chunk's own keys, in order (the mask needs them last)
    assert causal[0][-case.new_tokens :] == list(range(case.start, end))
    every = sorted(k for _, keys in read for k in keys)
    assert every == list(range(end))  # the whole context, each key once, nothing stale
    for staged, keys in read:
        assert all(b < case.first_host_block for b in staged.block_table)
        slots = [s for s in staged.block_table if s in case.scratch]
        assert len(slots) == len(set(slots)) <= len(case.scratch)
        if not staged.causal:
            assert max(keys) < case.start
    host = [b for b in case.table[: -(-end // case.block_size)] if b >= case.first_host_block]
    if len(host) <= len(case.scratch):  # one pass: the kernel's own keys, in its order
        assert len(read) == 1 and read[0][1] == list(range(end))


@settings(max_examples=200, deadline=None)
@given(cases())
def test_a_chunk_cut_to_fit_stages_and_one_more_token_would_not(case: Case) -> None:
    fit = staged_prefill.chunk_tokens_that_fit(
        block_table=case.table,
        start=case.start,
        new_tokens=case.new_tokens,
        block_size=case.block_size,
        first_host_block=case.first_host_block,
        scratch_blocks=len(case.scratch),
    )
    assert 1 <= fit <= case.new_tokens
    cut = Case(**{**case.__dict__, "new_tokens": fit})
    run_passes(cut)  # no ValueError
    if fit < case.new_tokens:
        more = Case(**{**case.__dict__, "new_tokens": fit + 1})
        with pytest.raises(ValueError, match="schedule fewer tokens"):
            run_passes(more)


def test_blocks_not_allocated_yet_count_as_host() -> None:
    """The scheduler asks before vLLM allocates the chunk's blocks: the ones past the row
    may come from the host part."""
    fit = staged_prefill.chunk_tokens_that_fit(
        block_table=[0, 1],
        start=16,
        new_tokens=64,
        block_size=16,
        first_host_block=10,
        scratch_blocks=2,
    )
    assert fit == 16 + 32  # block 1 (GPU) and two new ones


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=30))
def test_copy_runs_merge_consecutive_pairs_and_only_those(pairs: list[tuple[int, int]]) -> None:
    runs = staged_prefill.copy_runs(pairs)
    assert [(r.src + i, r.dst + i) for r in runs for i in range(r.count)] == pairs
    for a, b in itertools.pairwise(runs):
        assert (b.src, b.dst) != (a.src + a.count, a.dst + a.count)


def test_split_passes_merged_by_log_sum_exp_equal_the_whole_attention() -> None:
    """The arithmetic the caller does with several passes: each pass's attention and its
    log-sum-exp, merged, equal attention over the whole context (float64)."""
    import torch

    torch.manual_seed(0)
    bs, heads, dim = 4, 2, 8
    case = Case(
        table=list(range(20, 32)),
        start=30,
        new_tokens=14,
        block_size=bs,
        first_host_block=20,
        scratch=[1, 2, 3, 4, 5],
    )
    read = run_passes(case)
    assert len(read) == 3  # 12 host blocks: 4 own + 1 past, then 5 and 2 past
    keys = torch.randn(44, heads, dim, dtype=torch.float64)
    values = torch.randn(44, heads, dim, dtype=torch.float64)
    q = torch.randn(case.new_tokens, heads, dim, dtype=torch.float64)

    def attend(positions: list[int], causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """What a varlen kernel computes over these keys: causal means aligned to the last
        key (query i sees key j when j <= i + keys - queries), as FlashAttention does."""
        scores = torch.einsum("qhd,khd->hqk", q, keys[positions]) / math.sqrt(dim)
        if causal:
            shift = len(positions) - case.new_tokens
            hidden = (
                torch.arange(len(positions))[None] > torch.arange(case.new_tokens)[:, None] + shift
            )
            scores.masked_fill_(hidden, float("-inf"))
        lse = torch.logsumexp(scores, -1)
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), values[positions]), lse

    outs = [attend(keys_read, staged.causal) for staged, keys_read in read]
    lse = torch.logsumexp(torch.stack([lse for _, lse in outs]), 0)
    merged = sum(out * torch.exp(part - lse).transpose(0, 1)[..., None] for out, part in outs)
    whole, _ = attend(list(range(44)), causal=True)
    assert torch.allclose(merged, whole, atol=1e-12)


def test_scratch_for_the_8b_shape_at_65536_tokens_on_a_2_gib_pool() -> None:
    """49,152 spilled tokens, 16-token blocks of 64 KiB per layer: 3,072 scratch IDs, two
    buffers of 192 MiB; a spill off the 2 MiB granule rounds up to it."""
    page = 16 * 8 * 128 * 2 * 2
    assert staged_prefill.scratch_blocks(spill_tokens=49152, block_size=16, page_bytes=page) == (
        3072,
        384 << 20,
    )
    assert (
        staged_prefill.scratch_blocks(spill_tokens=49153, block_size=16, page_bytes=page)[0]
        == 3072 + 32
    )
    assert staged_prefill.scratch_blocks(spill_tokens=0, block_size=16, page_bytes=page) == (0, 0)


@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC"])
def test_the_scratch_ranges_are_the_scratch_blocks_of_each_layer_in_turn(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """The pool patch 0006 sizes for the demo model (2 layers, 16 KiB pages: 128 blocks a
    granule), 128 scratch IDs before its host blocks: marked through vLLM's own views of
    the pool (the tensors the kernels get), layer i's scratch pages must be exactly the
    range the worker maps onto buffer i % 2. A block-outermost layout is refused."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.kv_cache_interface import create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout

    from tests.vllm_patches.test_host_extension import GPU_BYTES, HOST_BYTES, config
    from tests.vllm_patches.test_kv_offload_capacity import kv_configs

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)
    (kv_config,) = kv_configs(config(demo_dir, 4096, HOST_BYTES, layout), GPU_BYTES)
    scratch = staged_prefill.scratch_ids(
        num_blocks=kv_config.num_blocks,
        num_host_blocks=kv_config.num_host_blocks,
        scratch_blocks=128,
    )
    assert scratch == range(128, 256)  # 256 GPU blocks, then 256 host blocks
    if layout == "BLHNC":
        with pytest.raises(ValueError, match="layer-outermost KV cache layout"):
            staged_prefill.scratch_ranges(kv_config, scratch)
        return
    (tensor,) = kv_config.kv_cache_tensors
    spec = kv_config.kv_cache_groups[0].kv_cache_spec
    buf = torch.zeros(tensor.size, dtype=torch.int8)
    views = create_kv_cache_views(buf, spec, kv_config.num_blocks, KVCacheLayout[layout], tensor)
    for index, view in enumerate(views):
        view[scratch.start : scratch.stop].view(torch.int8).fill_(index % 2 + 1)
    expected = torch.zeros_like(buf)
    ranges = staged_prefill.scratch_ranges(kv_config, scratch)
    for start, end, buffer in ranges:
        expected[start:end] = buffer + 1
    assert [b for *_, b in ranges] == [0, 1]
    assert torch.equal(buf, expected)


@settings(max_examples=150, deadline=None)
@given(st.lists(cases(), min_size=1, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4))
def test_the_device_rewrite_is_stage_chunks_one_pass_row_by_row(
    batch: list[Case], staged_rows: list[bool]
) -> None:
    """Several requests in one step, some prefilling (staged), some not: the tensor
    version's rows and pairs are what stage_chunk gives each staged row with the scratch
    blocks that follow the previous rows' (rows of one table share one first host block;
    each case's is made the same by offsetting its IDs)."""
    import torch

    from vllm_offload.vllm_ext.staged_device import rewrite_rows

    bs, first_host, scratch = 4, 1000, range(100, 200)
    rows, expected_rows, expected_pairs, at = [], [], [], scratch.start
    for case, staged in zip(batch, staged_rows, strict=False):
        shift = first_host - case.first_host_block  # host IDs >= 1000, GPU IDs below
        table = [b + shift if b >= case.first_host_block else b for b in case.table]
        end = case.start + case.new_tokens
        end = min(end, len(table) * bs)
        used = -(-end // bs)
        rows.append((table, used))
        host = sum(b >= first_host for b in table[:used])
        if not staged or not host:
            expected_rows.append(table)
            continue
        start = min(case.start, end - 1)
        (one,) = stage_chunk(
            block_table=table,
            start=start,
            new_tokens=end - start,
            block_size=bs,
            first_host_block=first_host,
            scratch=range(at, at + host),
        )
        expected_rows.append([*one.block_table, *table[used:]])
        expected_pairs += sorted({*one.copies, *one.mirrors}, key=lambda p: p[1])
        at += host
    width = max(len(t) for t, _ in rows)
    padded = torch.tensor([t + [0] * (width - len(t)) for t, _ in rows], dtype=torch.int32)
    got, src, dst, needed = rewrite_rows(
        padded,
        torch.tensor([u for _, u in rows]),
        torch.tensor(staged_rows[: len(rows)]),
        first_host,
        scratch,
    )
    assert int(needed) == at - scratch.start
    assert [r[: len(e)] for r, e in zip(got.tolist(), expected_rows, strict=True)] == expected_rows
    assert list(zip(src.tolist(), dst.tolist(), strict=True)) == expected_pairs


def test_the_device_rewrite_says_when_the_scratch_is_short() -> None:
    import torch

    from vllm_offload.vllm_ext.staged_device import rewrite_rows

    table = torch.tensor([[1, 2, 50, 51, 52]], dtype=torch.int32)
    got, src, dst, needed = rewrite_rows(
        table, torch.tensor([5]), torch.tensor([True]), 50, range(10, 12)
    )
    assert int(needed) == 3  # more than the 2 scratch blocks: the caller splits passes
    assert (src.tolist(), dst.tolist()) == ([50, 51], [10, 11])
    assert got.tolist() == [[1, 2, 10, 11, 52]]  # not valid as a table: too few slots


def test_a_long_request_through_vllms_scheduler_stages_every_chunk_in_one_pass(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own Scheduler, chunked prefill of 1,024 tokens, on a pool patch 0006 sizes
    (512 GPU blocks, then 256 host blocks) of which the scratch for the request's spill
    (``scratch_blocks``: 256 IDs, two granules) is held back, as the engine core will:
    every chunk's row stages in one pass (the bit-identical path), decode rows are never
    touched, and the blocks copied add up to the floor formula's sum over the chunks of
    their past host context."""
    from vllm import SamplingParams
    from vllm.platforms import current_platform
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.vllm_patches.test_host_extension import HOST_BYTES, config
    from tests.vllm_patches.test_kv_offload_capacity import BYTES_PER_BLOCK, kv_configs

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)
    bs, prompt_tokens, chunk = 16, 8000, 1024
    vllm_config = config(demo_dir, 8176, HOST_BYTES)
    vllm_config.scheduler_config.max_num_batched_tokens = chunk
    (kv_config,) = kv_configs(vllm_config, 512 * BYTES_PER_BLOCK)
    first_host = kv_config.num_blocks - kv_config.num_host_blocks
    assert (first_host, kv_config.num_host_blocks) == (512, 256)
    vllm_config.cache_config.num_gpu_blocks = kv_config.num_blocks
    scheduler = Scheduler(
        vllm_config, kv_config, StructuredOutputManager(vllm_config), block_size=bs
    )
    pool = scheduler.kv_cache_manager.block_pool
    gpu_left = first_host - 1  # the null block
    spill = prompt_tokens - (gpu_left - 256) * bs  # 3,920 tokens past the GPU part
    count, _ = staged_prefill.scratch_blocks(
        spill_tokens=spill, block_size=bs, page_bytes=BYTES_PER_BLOCK // 2
    )
    scratch = [b.block_id for b in pool.get_new_blocks(count)]  # held back
    assert count == 256
    kv_cache_utils.init_none_hash(sha256)
    request = Request(
        "r",
        list(range(1, prompt_tokens + 1)),
        SamplingParams(max_tokens=2, ignore_eos=True),
        None,
        block_hasher=kv_cache_utils.get_request_block_hasher(bs, sha256),
    )
    scheduler.add_request(request)
    gpu_tokens = (gpu_left - count) * bs
    copied, expected, steps = 0, 0, 0
    while request.num_computed_tokens < prompt_tokens:
        start = request.num_computed_tokens
        output = scheduler.schedule()
        new = output.num_scheduled_tokens["r"]
        (table,) = scheduler.kv_cache_manager.get_block_ids("r")
        passes = stage_chunk(
            block_table=table,
            start=start,
            new_tokens=new,
            block_size=bs,
            first_host_block=first_host,
            scratch=scratch,
        )
        assert len(passes) == 1
        copied += len(passes[0].copies)
        expected += -(-max(0, start - gpu_tokens) // bs)
        steps += 1
        done = start + new >= prompt_tokens
        scheduler.update_from_output(
            output,
            ModelRunnerOutput(
                req_ids=["r"], req_id_to_index={"r": 0}, sampled_token_ids=[[7] if done else []]
            ),
        )
    assert steps == -(-prompt_tokens // chunk)
    assert copied == expected > 0
