#!/usr/bin/env python3
"""Host buffers for GPU copies: torch pinned vs pageable vs pageable + cudaHostRegister.

    python benchmarks/pinned_memory.py [--tensors 8] [--tensor-gib 1.25] [--out FILE.json]

For each strategy it allocates ``--tensors`` buffers of ``--tensor-gib`` (the
shape of a CPU KV tier: one tensor per layer) and reports the allocation time,
the host RAM actually taken (drop of MemAvailable), and copy bandwidth: one large
H2D and D2H copy, and scattered block copies of 64 KiB, 512 KiB (one layer's 128-token
block of Llama-3-8B) and 2 MiB (what KV offload moves). torch only; needs an NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

GIB = 1 << 30
CHUNK = 1 << 30


def available() -> int:
    return int(psutil.virtual_memory().available)


def torch_pinned(num_bytes: int) -> torch.Tensor:
    return torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)


def pageable(num_bytes: int) -> torch.Tensor:
    buffer = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(buffer, dtype=torch.uint8)
    tensor.fill_(0)  # commit the pages, as a zero-initialised tier does
    return tensor


_registered: list[int] = []


def registered(num_bytes: int) -> torch.Tensor:
    buffer = mmap.mmap(-1, num_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    tensor = torch.frombuffer(buffer, dtype=torch.uint8)
    cudart = torch.cuda.cudart()
    for offset in range(0, num_bytes, CHUNK):
        ptr = tensor.data_ptr() + offset
        result = cudart.cudaHostRegister(ptr, min(CHUNK, num_bytes - offset), 0)
        if int(getattr(result, "value", result)) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {result}")
        _registered.append(ptr)
    return tensor


def unregister_all() -> None:
    cudart = torch.cuda.cudart()
    for ptr in _registered:
        cudart.cudaHostUnregister(ptr)
    _registered.clear()


def gbps(num_bytes: int, seconds: float) -> float:
    return round(num_bytes / seconds / 1e9, 2)


def time_copy(fn: Callable[[], None], repeat: int = 5) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()  # warm up
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeat


def block_bandwidth(
    host: torch.Tensor, gpu: torch.Tensor, block: int, capturable: bool
) -> dict[str, float | None]:
    """Scattered copies of ``block`` bytes, one copy_ per block, as KV offload issues them."""
    blocks = gpu.numel() // block
    count = min(2048, blocks)
    index = torch.randperm(blocks)[:count].tolist()
    host_blocks = host[: blocks * block].view(-1, block)
    gpu_blocks = gpu[: blocks * block].view(-1, block)

    def h2d() -> None:
        for i, j in enumerate(index):
            gpu_blocks[i].copy_(host_blocks[j], non_blocking=True)

    def d2h() -> None:
        for i, j in enumerate(index):
            host_blocks[j].copy_(gpu_blocks[i], non_blocking=True)

    label = f"{block >> 10}KiB"
    return {
        f"h2d_{label}_gbps": gbps(count * block, time_copy(h2d, 3)),
        f"d2h_{label}_gbps": gbps(count * block, time_copy(d2h, 3)),
        # The same copies replayed from a CUDA graph: no Python or launch cost, so what is
        # left is the DMA itself. Pageable memory cannot be captured (None).
        f"h2d_{label}_graph_gbps": graph_gbps(h2d, count * block) if capturable else None,
        f"d2h_{label}_graph_gbps": graph_gbps(d2h, count * block) if capturable else None,
    }


def graph_gbps(copies: Callable[[], None], num_bytes: int) -> float:
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        copies()  # warm up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph, stream=stream):
        copies()
    return gbps(num_bytes, time_copy(graph.replay, 5))


def bandwidth(host: torch.Tensor, num_bytes: int, capturable: bool) -> dict[str, float | None]:
    gpu = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    result = {
        "h2d_gbps": gbps(num_bytes, time_copy(lambda: gpu.copy_(host[:num_bytes], True))),
        "d2h_gbps": gbps(num_bytes, time_copy(lambda: host[:num_bytes].copy_(gpu, True))),
    }
    for block in (64 << 10, 512 << 10, 2 << 20):
        result |= block_bandwidth(host, gpu, block, capturable)
    return result


def measure(name: str, alloc: Callable[[int], torch.Tensor], args: argparse.Namespace) -> dict:
    tensor_bytes = int(args.tensor_gib * GIB)
    gc.collect()
    before = available()
    began = time.perf_counter()
    tensors = [alloc(tensor_bytes) for _ in range(args.tensors)]
    alloc_s = time.perf_counter() - began
    time.sleep(1)
    taken = before - available()
    result = {
        "strategy": name,
        "buffers": f"{args.tensors} x {args.tensor_gib} GiB",
        "requested_gib": round(args.tensors * tensor_bytes / GIB, 3),
        "host_ram_taken_gib": round(taken / GIB, 3),
        "alloc_s": round(alloc_s, 2),
        # Pageable memory cannot be captured in a CUDA graph.
        **bandwidth(tensors[0], min(tensor_bytes, GIB), capturable=name != "pageable"),
    }
    del tensors
    if name == "registered":
        unregister_all()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=8)
    parser.add_argument("--tensor-gib", type=float, default=1.25)
    parser.add_argument("--out", type=Path, default=Path("artifacts/pinned_memory.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "pinned_memory.py needs an NVIDIA GPU (torch.cuda.is_available() is False)"
        )
    strategies = {"torch_pinned": torch_pinned, "pageable": pageable, "registered": registered}
    results = [measure(name, alloc, args) for name, alloc in strategies.items()]
    keys = list(results[0])
    print(" | ".join(keys))
    for row in results:
        print(" | ".join(str(row[k]) for k in keys), flush=True)
    pinned, reg = results[0], results[2]
    ratio = {k: round(reg[k] / pinned[k], 3) for k in keys if k.endswith("gbps") and pinned[k]}
    print("registered / torch_pinned bandwidth:", json.dumps(ratio))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "results": results,
                "registered_over_pinned": ratio,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
