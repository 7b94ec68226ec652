#!/usr/bin/env python3
"""Issue #41 on the GPU host, before any server: vllm_ext.staged_attention's impl against
vLLM 0.33's own FlashAttention impl, one layer of the Llama-3-8B shape (32 query heads, 8
KV heads, 128 dims, bf16, 16-token blocks) on a pool of 1,024 GPU blocks (16,384 tokens)
then 7,168 blocks (114,688 tokens) of host RAM mapped by patch 0006's allocator
(kv_host_mapping.allocate), filled with random K/V; metadata as vLLM's builder makes it on
Hopper (FlashAttention 3's schedule planned ahead of time).

1. exactness: the staged impl's output equals FlashAttention's on an all-GPU copy of the
   pool, bit for bit, for the last 8k chunk of a 65,536- and of a 131,072-token request,
   and a batch of decode rows reaching host blocks, the first chunk and a prefill on GPU
   blocks only (the other rows run once with the staged row's keys set to 0; the staged
   row without the batch's schedule: exact sums, maybe not the same rounding); beside
   each, whether the all-GPU kernel without the planned schedule gives the same bits;
   and a control: one K value in a host block changed must change the staged output;
2. time of one layer (CUDA events, medians of 5 with min-max): FlashAttention on the
   all-GPU pool, the staged impl (copies + kernel), and FlashAttention reading the host
   blocks in place (today's path; 1 repeat), for the last 8k and 2k chunks of 65,536.

Needs vLLM 0.33.0 (the bundle) and vllm_offload on PYTHONPATH. Writes
$OUT/staged_attention_check.json.

    python3 benchmarks/gpu/staged_attention_check.py
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

Q_HEADS, KV_HEADS, DIM, BLOCK = 32, 8, 128, 16
GPU_BLOCKS, HOST_BLOCKS = 1024, 7168
CONTEXT = 131072
PAGE = BLOCK * KV_HEADS * 2 * DIM * 2  # one block of one layer, K and V, bf16


def pool() -> tuple[torch.Tensor, torch.Tensor]:
    """(the mapped pool, an all-GPU copy), as (blocks, kv heads, block, 2 x dim) bf16."""
    from vllm_offload.vllm_ext import kv_host_mapping

    torch.zeros(1, device="cuda")  # the CUDA context the driver calls need
    blocks = GPU_BLOCKS + HOST_BLOCKS
    tensor = SimpleNamespace(layers=["l0"], layer_stride=blocks * PAGE, block_stride=PAGE, offset=0)
    config = SimpleNamespace(
        num_blocks=blocks, num_host_blocks=HOST_BLOCKS, kv_cache_tensors=[tensor]
    )
    buf = kv_host_mapping.allocate(config, blocks * PAGE, torch.device("cuda", 0))
    mapped = buf.view(torch.bfloat16).view(blocks, KV_HEADS, BLOCK, 2 * DIM)
    on_gpu = torch.randn(mapped.shape, dtype=torch.bfloat16, device="cuda")
    mapped.copy_(on_gpu)
    return mapped, on_gpu


def impls() -> tuple[Any, Any]:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionImpl

    from vllm_offload.vllm_ext.staged_attention import StagedFlashAttentionImpl

    args = dict(
        num_heads=Q_HEADS,
        head_size=DIM,
        scale=1 / math.sqrt(DIM),
        num_kv_heads=KV_HEADS,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
    )
    plain, staged = FlashAttentionImpl(**args), StagedFlashAttentionImpl(**args)
    staged._scratch = torch.empty(CONTEXT * KV_HEADS * 2 * DIM * 2, dtype=torch.int8, device="cuda")
    return plain, staged


def metadata(rows: list[tuple[int, int, list[int]]], aot: bool = True) -> Any:
    """As vLLM's builder makes it for these rows: with FlashAttention 3's schedule planned
    ahead of time (``aot``), as on a Hopper GPU."""
    from vllm.v1.attention.backends.fa_utils import get_scheduler_metadata
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    starts = [0]
    for tokens, _, _ in rows:
        starts.append(starts[-1] + tokens)
    width = max(len(t) for *_, t in rows)
    table = [t + [0] * (width - len(t)) for *_, t in rows]
    cuda = {"device": "cuda", "dtype": torch.int32}
    query_start_loc = torch.tensor(starts, **cuda)
    seq_lens = torch.tensor([s for _, s, _ in rows], **cuda)
    max_query_len, max_seq_len = max(t for t, _, _ in rows), max(s for _, s, _ in rows)
    schedule = None
    if aot:
        schedule = get_scheduler_metadata(
            batch_size=len(rows),
            max_seqlen_q=max_query_len,
            max_seqlen_k=max_seq_len,
            num_heads_q=Q_HEADS,
            num_heads_kv=KV_HEADS,
            headdim=DIM,
            cache_seqlens=seq_lens,
            qkv_dtype=torch.bfloat16,
            cu_seqlens_q=query_start_loc,
            page_size=BLOCK,
            causal=True,
            window_size=(-1, -1),
            num_splits=0,
        )
    return FlashAttentionMetadata(
        num_actual_tokens=starts[-1],
        max_query_len=max_query_len,
        query_start_loc=query_start_loc,
        max_seq_len=max_seq_len,
        seq_lens=seq_lens,
        block_table=torch.tensor(table, **cuda),
        slot_mapping=torch.zeros(starts[-1], device="cuda", dtype=torch.int64),
        scheduler_metadata=schedule,
    )


def request_row(start: int, chunk: int) -> tuple[int, int, list[int]]:
    """A chunk of ``chunk`` tokens after ``start`` of a request whose blocks are the pool's
    in order (GPU blocks first, as DeviceFirstFreeBlockQueue hands them out)."""
    end = start + chunk
    return (chunk, end, list(range(-(-end // BLOCK))))


def run(
    impl: Any, kv_cache: torch.Tensor, rows: list[tuple[int, int, list[int]]], aot: bool = True
) -> torch.Tensor:
    meta = metadata(rows, aot)  # a fresh step: the staged impl plans it once
    tokens = meta.num_actual_tokens
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    query = torch.randn(
        tokens, Q_HEADS, DIM, dtype=torch.bfloat16, device="cuda", generator=generator
    )
    output = torch.full_like(query, float("nan"))
    one = torch.ones(1, dtype=torch.float32, device="cuda")
    layer = SimpleNamespace(_q_scale=one, _k_scale=one, _v_scale=one)
    impl.forward(layer, query, query, query, kv_cache, meta, output)
    return output


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, Any]:
    fn()  # warm
    times = []
    for _ in range(repeats):
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        fn()
        ended.record()
        torch.cuda.synchronize()
        times.append(began.elapsed_time(ended))
    return {"ms_median": statistics.median(times), "ms_min_max": [min(times), max(times)]}


def main() -> None:
    from vllm_offload.vllm_ext import kv_host_mapping

    torch.manual_seed(0)
    mapped, on_gpu = pool()
    plain, staged = impls()
    split = kv_host_mapping.pool_split(mapped.device)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "pool": {"gpu_blocks": GPU_BLOCKS, "host_blocks": HOST_BLOCKS, "split": split},
    }
    last_8k = request_row(65536 - 8192, 8192)
    decodes = [(1, 30000 + 17 * i, list(range(-(-(30000 + 17 * i) // BLOCK)))) for i in range(3)]
    gpu_only = (512, 4096, list(range(4096 // BLOCK)))
    cases = {
        "last_8k_chunk_of_65536": [last_8k],
        "last_8k_chunk_of_131072": [request_row(CONTEXT - 8192, 8192)],
        "mixed_batch": [*decodes, last_8k, gpu_only],
    }
    exact: dict[str, Any] = {}
    for name, rows in cases.items():
        want = run(plain, on_gpu, rows)
        got = run(staged, mapped, rows)
        unplanned = run(plain, on_gpu, rows, aot=False)  # does the schedule change the sums?
        exact[name] = {
            "bit_identical": bool(torch.equal(got, want)),
            "max_abs_diff": float((got.float() - want.float()).abs().max()),
            "all_gpu_without_aot_schedule_identical": bool(torch.equal(unplanned, want)),
        }
    host_block = GPU_BLOCKS + 100  # a block of the last chunk's context in host RAM
    before = run(staged, mapped, [last_8k])
    mapped[host_block, 0, 3, 5] += 1.0
    after = run(staged, mapped, [last_8k])
    mapped[host_block, 0, 3, 5] -= 1.0
    exact["control_changed_output"] = not bool(torch.equal(before, after))
    result["exactness"] = exact
    print("exactness:", exact, flush=True)
    timing: dict[str, Any] = {}
    for chunk in (8192, 2048):
        rows = [request_row(65536 - chunk, chunk)]
        host_bytes = (65536 - GPU_BLOCKS * BLOCK) * KV_HEADS * 2 * DIM * 2
        timing[str(chunk)] = {
            "host_bytes_copied": host_bytes,
            "all_gpu": timed(lambda rows=rows: run(plain, on_gpu, rows), 5),
            "staged": timed(lambda rows=rows: run(staged, mapped, rows), 5),
            "in_place": timed(lambda rows=rows: run(plain, mapped, rows), 1),
        }
        print(chunk, json.dumps(timing[str(chunk)]), flush=True)
    result["one_layer"] = timing
    out = Path(os.environ.get("OUT", "."))
    (out / "staged_attention_check.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
