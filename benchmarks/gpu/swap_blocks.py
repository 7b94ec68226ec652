#!/usr/bin/env python3
"""Issue #33: the CPU tier's load copies alone, by GPU block size (no server).

    python3 benchmarks/gpu/swap_blocks.py --out swap_blocks.json [--blocks 16,32,64,128]

A Llama-3-8B-shaped KV cache (32 layers, 4,096 bytes per token and layer: K and V of 8
heads x 128 x bf16) on the GPU, one tensor per layer of ``num_blocks x block`` tokens,
and a CPU tier laid out as vLLM 0.32's (rows of one 256-token chunk, each row holding
every layer's page of that chunk: mmap'd, then cudaHostRegister'ed). A CPU hit of
``--doc-tokens`` (31 chunks = 7,936 tokens by default) is copied into GPU blocks with
the descriptors vLLM's worker builds (``compute_sub_block_ptrs``: one descriptor per GPU
block and layer) through vLLM's own copy entry points:

  layer     one ``swap_blocks_batch`` (cuMemcpyBatchAsync) per layer and document, an
            event after each: patch 0005's layer-wise loads
  whole     one ``swap_blocks_batch`` per document, every layer in it: vLLM's own loads
  merged    as ``layer``, with descriptors that continue each other (contiguous GPU blocks
            under one chunk) joined into one: what coalescing would buy
  triton-S  vLLM's Triton copy kernel (``swap_blocks_triton``) on S programs, per layer

GPU blocks are drawn at random from the pool (``scattered``, as in a busy server) or
taken in order (``contiguous``, a fresh one). One document (a lone CPU hit) and
``--burst`` documents one after another (a burst of hits in one step). For each: the
GPU time from an event before the first copy to one after the last (median of
``--repeats``), the host time to submit them, GB/s; and the link itself: 1 GiB in 64 MiB
descriptors. The copied bytes are checked against the tier's (one 8-byte word per 4 KiB).
Needs an NVIDIA GPU and vLLM 0.32 (its _C ops and Triton).
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

LAYERS = 32
TOKEN_LAYER_BYTES = 2 * 8 * 128 * 2  # K and V, 8 KV heads, head dim 128, bf16
WORD_STRIDE = 4096  # one checked 8-byte word per 4 KiB
GIB = 1 << 30


def registered_host(num_bytes: int) -> tuple[torch.Tensor, mmap.mmap]:
    """Anonymous mmap, cudaHostRegister'ed in one piece as vLLM's tier is (its pieces are
    64 GiB), through torch's cudart as benchmarks/pinned_memory.py does."""
    buffer = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    host = torch.frombuffer(buffer, dtype=torch.int8)
    result = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), num_bytes, 0)
    if int(getattr(result, "value", result)) != 0:
        raise RuntimeError(f"cudaHostRegister failed: {result}")
    return host, buffer


def descriptors(
    cpu_layers: list[torch.Tensor],
    gpu_layers: list[torch.Tensor],
    chunk_ids: np.ndarray,
    block_ids: np.ndarray,
    blocks_per_chunk: int,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per layer (src, dst, sizes) for one document, as vLLM's _fill_direct_ops builds
    them: CPU chunk rows split into GPU-block-sized sub-blocks, one per GPU block."""
    from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs

    n = len(block_ids)
    out = []
    for cpu, gpu in zip(cpu_layers, gpu_layers, strict=True):
        src = np.empty(n, dtype=np.int64)
        dst = np.empty(n, dtype=np.int64)
        compute_sub_block_ptrs(chunk_ids, blocks_per_chunk, src, cpu)
        compute_sub_block_ptrs(block_ids, 1, dst, gpu)
        out.append((src, dst, np.full(n, gpu.shape[1], dtype=np.int64)))
    return out


def merge(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Join descriptors whose source and destination both continue the previous one."""
    starts = np.ones(len(src), dtype=bool)
    starts[1:] = (src[1:] != src[:-1] + sizes[:-1]) | (dst[1:] != dst[:-1] + sizes[:-1])
    idx = np.flatnonzero(starts)
    merged_sizes = np.add.reduceat(sizes, idx)
    return src[idx], dst[idx], merged_sizes


Ops = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # pinned src, dst, sizes


def pinned(values: np.ndarray) -> torch.Tensor:
    t = torch.empty(len(values), dtype=torch.int64, pin_memory=True)
    t.numpy()[:] = values
    return t


def pin3(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray) -> Ops:
    return pinned(src), pinned(dst), pinned(sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--blocks", default="16,32,64,128", help="GPU block sizes, tokens")
    parser.add_argument("--chunk", type=int, default=256, help="CPU-tier chunk, tokens")
    parser.add_argument("--doc-tokens", type=int, default=7936)
    parser.add_argument("--burst", type=int, default=8, help="documents copied back to back")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--triton-programs", default="12,32,132")
    args = parser.parse_args()
    torch.cuda.init()
    from vllm import _custom_ops as ops
    from vllm.v1.kv_offload.cpu import swap_blocks_triton

    blocks = [int(b) for b in args.blocks.split(",")]
    chunks_per_doc = args.doc_tokens // args.chunk
    doc_tokens = chunks_per_doc * args.chunk
    chunk_page = args.chunk * TOKEN_LAYER_BYTES
    row = LAYERS * chunk_page
    num_chunks = args.burst * chunks_per_doc
    began = time.perf_counter()
    host, _buffer = registered_host(num_chunks * row)
    register_s = time.perf_counter() - began
    words = host.view(torch.int64)
    stride = WORD_STRIDE // 8
    words[::stride] = torch.arange(words[::stride].numel(), dtype=torch.int64)
    cpu_layers = [host.view(num_chunks, LAYERS, chunk_page)[:, layer, :] for layer in range(LAYERS)]
    gpu_tokens = -(-int(args.burst * doc_tokens * 1.25) // max(blocks)) * max(blocks)
    gpu = torch.zeros(LAYERS, gpu_tokens * TOKEN_LAYER_BYTES, dtype=torch.int8, device="cuda")
    stream = torch.cuda.Stream()
    rng = np.random.default_rng(0)
    chunk_order = rng.permutation(num_chunks)  # a tier's chunks are not in order either
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "layers": LAYERS,
        "token_layer_bytes": TOKEN_LAYER_BYTES,
        "chunk_tokens": args.chunk,
        "doc_tokens": doc_tokens,
        "doc_bytes": doc_tokens * LAYERS * TOKEN_LAYER_BYTES,
        "burst": args.burst,
        "host_register_s": round(register_s, 2),
        "triton": {
            "NUM_SMS": swap_blocks_triton.NUM_SMS,
            "THRESHOLD_BYTES": swap_blocks_triton.THRESHOLD_BYTES,
        },
        "runs": [],
    }

    def timed(submit: Callable[[], None], num_bytes: int) -> dict[str, Any]:
        gpu_ms, host_ms = [], []
        for i in range(args.repeats + 1):  # the first warms up
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                start.record(stream)
                submit()
                end.record(stream)
            t1 = time.perf_counter()
            end.synchronize()
            if i:
                gpu_ms.append(start.elapsed_time(end))
                host_ms.append((t1 - t0) * 1e3)
        ms = statistics.median(gpu_ms)
        return {
            "gpu_ms": round(ms, 3),
            "gpu_ms_min": round(min(gpu_ms), 3),
            "gpu_ms_max": round(max(gpu_ms), 3),
            "host_submit_ms": round(statistics.median(host_ms), 3),
            "gbps": round(num_bytes / (ms * 1e-3) / 1e9, 2),
        }

    # The link: 1 GiB of the tier in 64 MiB descriptors, and in one.
    link_gpu = gpu.view(-1)[:GIB]
    for pieces in (16, 1):
        size = GIB // pieces
        src = pinned(host.data_ptr() + np.arange(pieces, dtype=np.int64) * size)
        dst = pinned(link_gpu.data_ptr() + np.arange(pieces, dtype=np.int64) * size)
        sizes = pinned(np.full(pieces, size, dtype=np.int64))
        run = timed(lambda s=src, d=dst, z=sizes: ops.swap_blocks_batch(s, d, z, True), GIB)
        results[f"link_{pieces}x{size >> 20}MiB"] = run
        print(f"link {pieces} x {size >> 20} MiB: {run}", flush=True)

    for block in blocks:
        for placement in ("scattered", "contiguous"):
            results["runs"] += measure_layout(
                Layout(block, placement, args, cpu_layers, gpu, chunk_order, rng),
                timed,
                words,
                [int(p) for p in args.triton_programs.split(",")],
            )
    args.out.write_text(json.dumps(results, indent=1))


class Layout:
    """One GPU block size and placement: every document's descriptors, per layer (also
    merged) and whole, pinned as vLLM's worker keeps them."""

    def __init__(
        self,
        block: int,
        placement: str,
        args: argparse.Namespace,
        cpu_layers: list[torch.Tensor],
        gpu: torch.Tensor,
        chunk_order: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        self.block, self.placement = block, placement
        self.page = block * TOKEN_LAYER_BYTES
        self.gpu = gpu
        num_blocks = gpu.shape[1] // self.page
        gpu_layers = [gpu[layer].view(num_blocks, self.page) for layer in range(LAYERS)]
        per_chunk = args.chunk // block
        chunks_per_doc = args.doc_tokens // args.chunk
        blocks_per_doc = chunks_per_doc * per_chunk
        wanted = args.burst * blocks_per_doc
        ids = (
            rng.choice(num_blocks, size=wanted, replace=False)
            if placement == "scattered"
            else np.arange(wanted)
        )
        t0 = time.perf_counter()
        self.docs = [
            descriptors(
                cpu_layers,
                gpu_layers,
                chunk_order[d * chunks_per_doc : (d + 1) * chunks_per_doc],
                ids[d * blocks_per_doc : (d + 1) * blocks_per_doc],
                per_chunk,
            )
            for d in range(args.burst)
        ]
        self.build_ms_per_doc = (time.perf_counter() - t0) * 1e3 / args.burst
        self.layer_ops: list[list[Ops]] = [[pin3(*op) for op in doc] for doc in self.docs]
        self.whole_ops: list[Ops] = [
            pin3(*(np.concatenate([op[k] for op in doc]) for k in range(3))) for doc in self.docs
        ]
        self.merged_ops: list[list[Ops]] = [[pin3(*merge(*op)) for op in doc] for doc in self.docs]
        self.events = [torch.cuda.Event() for _ in range(LAYERS)]

    def by_layer(self, ops_of_docs: list[list[Ops]], n: int) -> Callable[[], None]:
        from vllm import _custom_ops as ops

        def submit() -> None:
            stream = torch.cuda.current_stream()
            for doc in ops_of_docs[:n]:
                for (s, d, z), event in zip(doc, self.events, strict=True):
                    ops.swap_blocks_batch(s, d, z, True)
                    event.record(stream)

        return submit

    def whole(self, n: int) -> Callable[[], None]:
        from vllm import _custom_ops as ops

        def submit() -> None:
            for s, d, z in self.whole_ops[:n]:
                ops.swap_blocks_batch(s, d, z, True)

        return submit

    def store(self, n: int) -> Callable[[], None]:
        """GPU -> tier, as the stores copy (stream-ordered source reads)."""
        from vllm import _custom_ops as ops

        def submit() -> None:
            for doc in self.layer_ops[:n]:
                for s, d, z in doc:
                    ops.swap_blocks_batch(d, s, z, False)

        return submit

    def triton(self, n: int, programs: int) -> Callable[[], None]:
        """vLLM's Triton copy kernel as its swap_blocks_batch launches it (descriptors sent
        to the GPU with each launch), on ``programs`` programs instead of NUM_SMS."""
        from vllm.v1.kv_offload.cpu import swap_blocks_triton

        chunk_bytes = min(1 << (self.page - 1).bit_length(), 8192)

        def submit() -> None:
            for doc in self.layer_ops[:n]:
                for s, d, z in doc:
                    swap_blocks_triton._swap_blocks_kernel[(min(programs, len(s)),)](
                        s.to("cuda", non_blocking=True),
                        d.to("cuda", non_blocking=True),
                        z.to("cuda", non_blocking=True),
                        len(s),
                        BYTES_PER_CHUNK=chunk_bytes,
                    )

        return submit


def measure_layout(
    layout: Layout,
    timed: Callable[[Callable[[], None], int], dict[str, Any]],
    words: torch.Tensor,
    triton_programs: list[int],
) -> list[dict[str, Any]]:
    doc_bytes = sum(int(op[2].sum()) for op in layout.docs[0])
    burst = len(layout.docs)
    modes: list[tuple[str, Callable[[int], Callable[[], None]], list[list[Ops]]]] = [
        ("layer", lambda n: layout.by_layer(layout.layer_ops, n), layout.layer_ops),
        ("whole", layout.whole, layout.layer_ops),
    ]
    if layout.placement == "contiguous":
        modes.append(("merged", lambda n: layout.by_layer(layout.merged_ops, n), layout.merged_ops))
    else:
        modes += [
            (f"triton-{p}", lambda n, p=p: layout.triton(n, p), layout.layer_ops)
            for p in triton_programs
        ]
        modes.append(("store", layout.store, layout.layer_ops))
    runs = []
    gpu = layout.gpu
    for mode, make, counted in modes:
        for n in sorted({1, burst}):
            if mode.startswith("triton") and n > 1:
                continue  # its rate shows on one document
            if mode == "store":  # write back what a load put there: the tier stays as it was
                layout.by_layer(layout.layer_ops, burst)()
                torch.cuda.synchronize()
            else:
                gpu.zero_()
            run = timed(make(n), n * doc_bytes)
            run.update(
                block=layout.block,
                page_bytes=layout.page,
                placement=layout.placement,
                mode=mode,
                docs=n,
                descriptors=sum(len(op[0]) for doc in counted[:n] for op in doc),
                build_ms_per_doc=round(layout.build_ms_per_doc, 3),
                correct=check(words, gpu, layout.docs[:n]),
            )
            runs.append(run)
            print(json.dumps(run), flush=True)
    return runs


def check(
    words: torch.Tensor,
    gpu: torch.Tensor,
    docs: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]],
) -> bool:
    """Every copied block's first word and a word per 4 KiB equal the tier's."""
    host_base = words.data_ptr()
    gpu_words = gpu.view(torch.int64).view(-1)
    gpu_base = gpu.data_ptr()
    want, got = [], []
    for doc in docs:
        for src, dst, sizes in doc[:: max(1, len(doc) // 4)]:  # four layers of each
            offsets = np.arange(0, int(sizes[0]), WORD_STRIDE)
            s = ((src[:, None] - host_base + offsets[None, :]) // 8).ravel()
            d = ((dst[:, None] - gpu_base + offsets[None, :]) // 8).ravel()
            want.append(words[torch.from_numpy(s)])
            got.append(gpu_words[torch.from_numpy(d).cuda()].cpu())
    return bool(torch.equal(torch.cat(want), torch.cat(got)))


if __name__ == "__main__":
    main()
