#!/usr/bin/env python3
"""Issue #58 on the GPU host, torch alone (no vLLM): does a wake's weight copy lose the
link's rate to its number of copies? The arena's wake copies an 8B model's 14.96 GiB back
in 137 allocations at ~44 GB/s, against ~55 GB/s for one copy
(docs/design/switch-below-the-copy.md). Here the same bytes from host memory made as the
arena makes it (an anonymous private mmap, cudaHostRegister'ed) to one device buffer,
timed with CUDA events, arms interleaved over --rounds:

  one        a single copy of all the bytes
  tensors    one copy per Llama-3.1-8B weight tensor (195: embedding, per layer the
             fused qkv, o, fused gate_up, down and two norms, final norm, lm_head)
  even137    137 copies of equal size (the wake's count of allocations)
  gib        copies of 1 GiB
  tensors2   the tensors' copies alternating over two streams
  pinned     a single copy from torch's own pinned memory (cudaHostAlloc)

and, as a wake makes them (kit.cumem: the driver's calls, as vLLM's CuMemAllocator makes
them), the 137 pieces each copied synchronously (the arena's cudaMemcpy), in turn:

  fresh      into 137 allocations mapped anew just before (cuMemCreate, cuMemMap,
             cuMemSetAccess: vLLM's wake_up), the mapping timed apart (map_s)
  buffer     into the one buffer the arms above write

Nineteenth session, an H100: the six arms above all ran at 55.1-55.5 GB/s, against the
wake's ~44 GB/s; fresh and buffer tell whether the fresh mappings or the synchronous
calls lose the rest.

Writes OUT/copy_sizes.json: each arm's seconds per round and GB/s (median, min-max).

    benchmarks/gpu/copy_sizes.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import mmap
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kit.cumem import Driver

MIB = 1 << 20
HIDDEN, INTER, LAYERS, VOCAB, KV_HEADS, HEAD = 4096, 14336, 32, 128256, 8, 128


def llama8b_tensors() -> list[int]:
    """The bytes (bf16) of Llama-3.1-8B's weight tensors in the order a forward reads
    them, as vLLM holds them (qkv and gate_up fused)."""
    qkv = HIDDEN * (HIDDEN + 2 * KV_HEADS * HEAD) * 2
    layer = [HIDDEN * 2, qkv, HIDDEN * HIDDEN * 2, HIDDEN * 2, HIDDEN * 2 * INTER * 2]
    layer.append(INTER * HIDDEN * 2)
    return [VOCAB * HIDDEN * 2, *layer * LAYERS, HIDDEN * 2, VOCAB * HIDDEN * 2]


def pieces(sizes: list[int]) -> list[tuple[int, int]]:
    offsets, at = [], 0
    for size in sizes:
        offsets.append((at, size))
        at += size
    return offsets


def timed(
    copies: list[tuple[int, int]], src: torch.Tensor, dst: torch.Tensor, streams: int
) -> float:
    """Seconds from the first copy's launch to the last's end (CUDA events)."""
    side = [torch.cuda.Stream() for _ in range(streams)]
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for s in side:
        s.wait_event(begin)
    for n, (offset, size) in enumerate(copies):
        with torch.cuda.stream(side[n % streams]):
            dst[offset : offset + size].copy_(src[offset : offset + size], non_blocking=True)
    for s in side:
        torch.cuda.current_stream().wait_stream(s)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000


def wake_like(
    rounds: int, sizes: list[int], src: torch.Tensor, dst: torch.Tensor
) -> dict[str, Any]:
    """Per round: ``sizes`` mapped anew (timed), copied into synchronously (timed), given
    back; and the same copies into ``dst``. Seconds per round, host clock (each copy
    returns when it is done)."""
    driver = Driver(torch.cuda.current_device())
    ranges = [(driver.reserve(size), size) for size in sizes]
    copies = pieces(sizes)
    seconds: dict[str, list[float]] = {"map_s": [], "fresh_s": [], "buffer_s": []}
    for _ in range(rounds + 1):  # the first warms both paths
        torch.cuda.synchronize()
        began = time.perf_counter()
        handles = [driver.create_and_map(ptr, size) for ptr, size in ranges]
        mapped = time.perf_counter()
        for (ptr, size), (offset, _) in zip(ranges, copies, strict=True):
            driver.copy_to_device(ptr, src.data_ptr() + offset, size)
        copied = time.perf_counter()
        for (ptr, size), handle in zip(ranges, handles, strict=True):
            driver.unmap_and_release(ptr, size, handle)
        into_buffer = time.perf_counter()
        for offset, size in copies:
            driver.copy_to_device(dst.data_ptr() + offset, src.data_ptr() + offset, size)
        seconds["buffer_s"].append(time.perf_counter() - into_buffer)  # the last copy done
        seconds["map_s"].append(mapped - began)
        seconds["fresh_s"].append(copied - mapped)
        driver.call("cuCtxSynchronize")
    total = sum(sizes)
    return {
        name: {"seconds": s[1:], "median_s": statistics.median(s[1:]), "copies": len(sizes)}
        | ({} if name == "map_s" else {"gb_s_median": total / statistics.median(s[1:]) / 1e9})
        for name, s in seconds.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    sizes = llama8b_tensors()
    total = sum(sizes)
    area = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    registered = torch.from_numpy(np.frombuffer(area, dtype=np.uint8))
    registered.fill_(7)  # pages touched, as the arena's are once it holds the weights
    code = torch.cuda.cudart().cudaHostRegister(registered.data_ptr(), total, 0)
    assert int(code) == 0, f"cudaHostRegister: {code}"
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    pinned.fill_(7)
    dst = torch.empty(total, dtype=torch.uint8, device="cuda")
    gib = [min(1 << 30, total - at) for at in range(0, total, 1 << 30)]
    even = [total // 137] * 136 + [total - 136 * (total // 137)]
    arms = {
        "one": (pieces([total]), registered, 1),
        "tensors": (pieces(sizes), registered, 1),
        "even137": (pieces(even), registered, 1),
        "gib": (pieces(gib), registered, 1),
        "tensors2": (pieces(sizes), registered, 2),
        "pinned": (pieces([total]), pinned, 1),
    }
    for copies, src, streams in arms.values():
        timed(copies, src, dst, streams)  # warm: each arm's streams and paths once
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, (copies, src, streams) in arms.items():
            seconds[name].append(timed(copies, src, dst, streams))
    try:
        wake = wake_like(args.rounds, even, registered, dst)
    except (OSError, RuntimeError) as exc:  # the arms above stand without it
        wake = {"error": str(exc)}
    same = bool(torch.equal(dst[:MIB].cpu(), registered[:MIB]))
    result = {
        "bytes": total,
        "tensors": len(sizes),
        "device": torch.cuda.get_device_name(),
        "registered_is_pinned": bool(registered.is_pinned()),
        "copied_bytes_match": same,
        "arms": {
            name: {
                "copies": len(arms[name][0]),
                "seconds": s,
                "median_s": statistics.median(s),
                "gb_s_median": total / statistics.median(s) / 1e9,
                "gb_s_min_max": [total / max(s) / 1e9, total / min(s) / 1e9],
            }
            for name, s in seconds.items()
        },
        "wake_like": wake,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "copy_sizes.json").write_text(json.dumps(result, indent=2))
    print(
        f"{total / 2**30:.2f} GiB, {result['device']}, registered pinned: "
        f"{result['registered_is_pinned']}, bytes match: {same}"
    )
    for name, arm in result["arms"].items():
        low, high = arm["gb_s_min_max"]
        print(
            f"{name:9s} {arm['copies']:4d} copies  {arm['median_s']:.4f} s  "
            f"{arm['gb_s_median']:.1f} GB/s ({low:.1f}-{high:.1f})"
        )
    print("as a wake (137 synchronous copies):", json.dumps(wake)[:400])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
