#!/usr/bin/env python3
"""Issue #18 on the GPU host: two facts the planner relies on, measured.

1. Does cudaHostRegister honour RLIMIT_MEMLOCK? A child process page-locks --gib of
   anonymous memory and copies it to the GPU, once as this process is (root: with
   CAP_IPC_LOCK) and once with the memlock limit at 8 MiB and CAP_IPC_LOCK dropped from
   its bounding set (what a non-root user outside the unit has). Each reports the
   register call's result and the host->GPU copy speed.
2. What NVML says of the PCIe link, and the plan's host->GPU figure from it.
3. Each GPU's total as the planner reads it (hardware.probe: NVML less its reserved
   memory) against CUDA's (torch.cuda.mem_get_info), the total vLLM budgets a share of.

    benchmarks/gpu/host_checks.py --out DIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import resource
import subprocess
import sys
import time
from pathlib import Path

PR_CAPBSET_DROP = 24
CAP_IPC_LOCK = 14
LIMITED_BYTES = 8 << 20


def child(gib: float) -> dict[str, object]:
    import torch

    from vllm_offload import hardware

    nbytes = int(gib * (1 << 30))
    buf = mmap.mmap(-1, nbytes)
    host = torch.frombuffer(buf, dtype=torch.uint8)
    host.fill_(1)  # fault the pages in first, as vLLM's tier is
    address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    error = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0))
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    speeds = []
    for _ in range(5):
        torch.cuda.synchronize()
        began = time.perf_counter()
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        speeds.append(nbytes / (time.perf_counter() - began) / 1e9)
    status = Path("/proc/self/status").read_text()
    effective = int(
        next(line for line in status.splitlines() if line.startswith("CapEff:")).split()[1], 16
    )
    return {
        "memlock_limit_bytes": hardware.probe().memlock_limit_bytes,
        "cap_ipc_lock": bool(effective >> CAP_IPC_LOCK & 1),
        "cudaHostRegister_error": error,
        "h2d_gb_per_s": sorted(speeds)[len(speeds) // 2],
    }


def limited() -> None:
    """In the child before exec: an 8 MiB memlock limit and no CAP_IPC_LOCK."""
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (LIMITED_BYTES, LIMITED_BYTES))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.gib)))
        return
    assert args.out is not None
    args.out.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, __file__, "--child", "--gib", str(args.gib)]
    arms: dict[str, object] = {}
    for name, setup in (("as is", None), ("memlock 8 MiB, no CAP_IPC_LOCK", limited)):
        done = subprocess.run(argv, preexec_fn=setup, capture_output=True, text=True)
        arms[name] = (
            json.loads(done.stdout.strip().splitlines()[-1])
            if done.returncode == 0
            else {"exit": done.returncode, "stderr": done.stderr[-2000:]}
        )
        print(name, arms[name], flush=True)
    import torch

    from vllm_offload import hardware
    from vllm_offload.plan import h2d_bytes_per_s

    facts = hardware.probe()
    speed, source = h2d_bytes_per_s(facts)
    cuda_totals = [torch.cuda.mem_get_info(g.index)[1] for g in facts.gpus]
    result = {
        "register_gib": args.gib,
        "arms": arms,
        "gpus": [vars(g) for g in facts.gpus],
        "probe_total_vs_cuda": [
            {"probe": g.total_bytes, "cuda": cuda, "equal": g.total_bytes == cuda}
            for g, cuda in zip(facts.gpus, cuda_totals, strict=True)
        ],
        "plan_h2d_bytes_per_s": speed,
        "plan_h2d_source": source,
    }
    print(json.dumps(result, indent=1))
    (args.out / "host_checks.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
