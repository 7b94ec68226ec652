#!/usr/bin/env python3
"""Issue #58 on a GPU host, torch alone (no vLLM): whether the driver's process checkpoint
takes what a sleeping engine keeps on the GPU to nothing, and what coming back costs.
A process keeps 0.60 GiB for its CUDA context alone and ~1.1 GiB with cuBLAS and an 8B
engine's CUDA graphs, which no release inside it hands back (gpu_floor.py); the driver's
``cuCheckpointProcessLock / Checkpoint / Restore / Unlock`` (CUDA 12.8+, Linux) copy a
process's device memory to host RAM and release its allocations and handles, from
another process.

A child holds what a sleeping engine keeps: its context, cuBLAS, graphs shaped like an 8B
engine's (gpu_floor.capture) and --keep-gib of device memory. This process, which makes
no CUDA context of its own (cuInit only, as a restore asks), locks, checkpoints,
restores and unlocks it --rounds times. Per round: each call's seconds, the child's GPU
memory (NVML) running, checkpointed and restored, the device's used memory, and whether
a graph replayed after the restore gives the bytes it gave before the first checkpoint
(and how long that first replay took).

    benchmarks/gpu/checkpoint_floor.py --out DIR [--rounds 3] [--keep-gib 1]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pynvml

sys.path.insert(0, str(Path(__file__).parent))
from kit.model import GIB
from kit.record import Record

PROCESS_STATES = ("running", "locked", "checkpointed", "failed", "checkpointing", "restoring")
CHILD_OPTIONS = ("keep_gib", "sizes", "pieces", "layers")  # passed on to the child


def child(args: argparse.Namespace) -> None:
    """What a sleeping engine keeps; answers each line on stdin with a probe's digest and
    the seconds its replay took."""
    import torch
    from gpu_floor import capture, capture_sizes

    torch.zeros(1, device="cuda")
    graphs = capture(capture_sizes(args.sizes), args.pieces, args.layers, 4096)
    kept = torch.full((int(args.keep_gib * GIB),), 7, dtype=torch.uint8, device="cuda")
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    probe = torch.cuda.CUDAGraph()
    with torch.cuda.graph(probe):
        y = torch.nn.functional.silu(x @ weight) + x + kept[:4096].to(torch.bfloat16)
    torch.cuda.synchronize()
    print(f"graphs {len(graphs)}", flush=True)
    for _ in sys.stdin:
        began = time.perf_counter()
        probe.replay()
        torch.cuda.synchronize()
        took = time.perf_counter() - began
        digest = hashlib.sha256(y.float().cpu().numpy().tobytes()).hexdigest()[:16]
        print(f"{digest} {took:.6f}", flush=True)


class Driver:
    """The CUDA driver's checkpoint calls on another process, timed."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.call("cuInit", 0)

    def call(self, name: str, *args: object) -> float:
        function = getattr(self.cuda, name)
        function.restype = ctypes.c_int
        began = time.perf_counter()
        result = function(*args)
        if result != 0:
            raise SystemExit(f"{name}: CUresult {result}")
        return time.perf_counter() - began

    def state(self, pid: int) -> str:
        state = ctypes.c_int(-1)
        self.call("cuCheckpointProcessGetState", pid, ctypes.byref(state))
        return PROCESS_STATES[state.value] if 0 <= state.value < 6 else str(state.value)


def gpu_memory(pid: int) -> dict[str, float]:
    """The process's GPU memory and the device's used memory, GiB (NVML)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    held = sum(
        int(p.usedGpuMemory or 0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        if p.pid == pid
    )
    used = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    return {"process_gib": held / GIB, "device_used_gib": used / GIB}


def ask(stdin: IO[str], stdout: IO[str]) -> tuple[str, float]:
    stdin.write("probe\n")
    stdin.flush()
    digest, took = stdout.readline().split()
    return digest, float(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep-gib", type=float, default=1.0, help="device memory it holds")
    parser.add_argument("--sizes", type=int, default=67, help="capture sizes (vLLM: up to 512)")
    parser.add_argument("--pieces", type=int, default=33, help="piecewise graphs per size")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.out is None:
        parser.error("--out is required")
    if args.keep_gib * GIB < 4096:
        parser.error("--keep-gib must hold at least 4,096 bytes: the probe reads them")
    pynvml.nvmlInit()
    driver = Driver()
    record = Record(args.out / "checkpoint_floor.json", vars(args))
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in CHILD_OPTIONS]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin and proc.stdout
    record["child"] = proc.stdout.readline().strip()
    reference, record["first_replay_s"] = ask(proc.stdin, proc.stdout)
    record["running"] = gpu_memory(proc.pid)
    record["rounds"] = []
    try:
        for _ in range(args.rounds):
            row: dict[str, object] = {
                "lock_s": driver.call("cuCheckpointProcessLock", proc.pid, None)
            }
            row["checkpoint_s"] = driver.call("cuCheckpointProcessCheckpoint", proc.pid, None)
            row["state"] = driver.state(proc.pid)
            row["checkpointed"] = gpu_memory(proc.pid)
            row["restore_s"] = driver.call("cuCheckpointProcessRestore", proc.pid, None)
            row["unlock_s"] = driver.call("cuCheckpointProcessUnlock", proc.pid, None)
            digest, row["replay_after_s"] = ask(proc.stdin, proc.stdout)
            row["same_answer"] = digest == reference
            row["restored"] = gpu_memory(proc.pid)
            record["rounds"].append(row)
            record.save()
            print(row, flush=True)
    finally:
        proc.kill()
        record.save()


if __name__ == "__main__":
    main()
