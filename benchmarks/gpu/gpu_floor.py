#!/usr/bin/env python3
"""Issue #58 on a GPU host, torch alone (no vLLM): what a process holds on the GPU that
no sleep can hand back, step by step: its CUDA context, cuBLAS, the caching allocator's
free blocks, and CUDA graphs shaped like an 8B engine's (vLLM's piecewise graphs: one per
capture size and piece between attention ops; full graphs for decode). A sleeping engine
releases its weights, KV cache and graph pools (vllm_ext/sleep.py); it kept 1.53-2.41 GiB
on an H200 (h200-vllm-0.33.0/start/): this says how much of that a live process must keep.

Per step: the process's GPU memory as NVML counts it (what `ps` and the planner report),
torch's reserved and allocated bytes, and the rest (NVML less reserved: the context,
library handles and graph executables, which no allocator releases).

    benchmarks/gpu/gpu_floor.py --out DIR [--sizes 67] [--pieces 33] [--layers 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pynvml
import torch

sys.path.insert(0, str(Path(__file__).parent))
from kit.model import GIB
from kit.record import Record


def process_bytes() -> int:
    """This process's GPU memory as NVML counts it."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if proc.pid == os.getpid():
            return int(proc.usedGpuMemory or 0)
    return 0


def step(record: Record, name: str) -> None:
    torch.cuda.synchronize()
    used, reserved = process_bytes(), torch.cuda.memory_reserved()
    row = {
        "step": name,
        "process_gib": used / GIB,
        "reserved_gib": reserved / GIB,
        "allocated_gib": torch.cuda.memory_allocated() / GIB,
        "rest_gib": (used - reserved) / GIB,
    }
    record["steps"].append(row)
    record.save()
    print(" ".join(f"{k} {v:.3f}" if isinstance(v, float) else str(v) for k, v in row.items()))


def capture_sizes(count: int) -> list[int]:
    """``count`` batch sizes to capture, 1 and every 8 after it, up to vLLM's 512."""
    return [min(512, 1 + i * 8) for i in range(count)]


def capture(sizes: list[int], pieces: int, layers: int, hidden: int) -> list[torch.cuda.CUDAGraph]:
    """Graphs in one pool, as vLLM captures them: per size, `pieces` short graphs (a few
    kernels each) and one full graph of every layer."""
    pool = torch.cuda.graph_pool_handle()
    weight = torch.randn(hidden, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    (weight @ weight).sum().item()  # cuBLAS makes its handle outside a capture (vLLM warms up)
    graphs = []
    for size in sizes:
        x = torch.randn(size, hidden, device="cuda", dtype=torch.bfloat16)
        for count, kernels in ((pieces, 3), (1, 4 * layers)):  # pieces, then the full graph
            for _ in range(count):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    y = x
                    for _ in range(kernels):
                        y = torch.nn.functional.silu(y @ weight) + x
                graphs.append(graph)
        del x
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, default=67, help="capture sizes (vLLM: up to 512)")
    parser.add_argument("--pieces", type=int, default=33, help="piecewise graphs per size")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    args = parser.parse_args()
    pynvml.nvmlInit()
    record = Record(args.out / "gpu_floor.json", vars(args))
    record["device"] = torch.cuda.get_device_name()
    record["steps"] = []
    torch.zeros(1, device="cuda")
    step(record, "context")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    del a
    step(record, "cublas")
    held = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda")
    del held
    step(record, "2 GiB freed, cached")
    torch.cuda.empty_cache()
    step(record, "empty_cache")
    sizes = capture_sizes(args.sizes)
    began = time.perf_counter()
    graphs = capture(sizes, args.pieces, args.layers, args.hidden)
    record["graphs"], record["capture_s"] = len(graphs), time.perf_counter() - began
    step(record, f"{len(graphs)} graphs")
    torch.cuda.empty_cache()
    step(record, "graphs, empty_cache")
    del graphs
    torch.cuda.empty_cache()
    step(record, "graphs deleted")


if __name__ == "__main__":
    main()
