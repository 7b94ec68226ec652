#!/usr/bin/env python3
"""Issue #20 on the GPU host: the disk tier behind the CPU tier, one run.

Servers through `vllm-offload serve` (Llama-3-8B shape, dummy weights, a GPU pool of
--pool-tokens): --docs documents of --doc-tokens token ids, read twice (pass 1 computes,
pass 2 repeats them once all were read), in arms:

  none        no tier
  cpu         the CPU tier only (--cpu-gib, smaller than the documents)
  cpu+disk    the CPU tier and a --disk-gib disk tier (the documents fit)
  restart     the cpu+disk server restarted on the same disk directory: pass 2 only
  bound       a disk tier of a third of the documents' KV (written 3x over): its size
              is sampled after every document

TTFT is the latency of a 1-token completion (prefill + one step). The disk's own read
speed (O_DIRECT, 16 MiB reads of a file written with O_DIRECT) is measured in the same
run as the floor. Writes OUT/disk_tier.json and each server's log.

    benchmarks/gpu/disk_tier.py --out DIR --disk DIR
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.model import KV_BYTES_PER_TOKEN

from vllm_offload import disk_layout
from vllm_offload.bench.server_process import ServerProcess

MODEL = "benchmarks/models/llama-3-8b"
DUMMY = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"]


def disk_read_gb_per_s(directory: Path, gib: int = 4) -> dict[str, Any]:
    """Write a file and read it back in 16 MiB blocks, with O_DIRECT where the filesystem
    takes it (else buffered, and the figure says so)."""
    probe = directory / "read-speed.probe"
    count = gib * 64
    result: dict[str, Any] = {"bytes": count * 16 << 20}
    for direct in (True, False):
        write = ["dd", "if=/dev/zero", f"of={probe}", "bs=16M", f"count={count}", "status=none"]
        read = ["dd", f"if={probe}", "of=/dev/null", "bs=16M", "status=none"]
        if direct:
            write.append("oflag=direct")
            read.append("iflag=direct")
        if subprocess.run(write).returncode:
            continue
        began = time.perf_counter()
        if subprocess.run(read).returncode == 0:
            seconds = time.perf_counter() - began
            result |= {
                "o_direct": direct,
                "seconds": seconds,
                "gb_per_s": result["bytes"] / seconds / 1e9,
            }
            break
    probe.unlink(missing_ok=True)
    return result


def tier_bytes(disk: Path) -> int:
    return sum(e.stat().st_size for e in disk_layout.block_files(disk))


def main() -> None:
    parser = options.parser(__doc__, pool_tokens=32768, docs=12, doc_tokens=8000)
    parser.add_argument("--disk", type=Path, required=True, help="the disk tier's directory")
    parser.add_argument("--model", default=MODEL, help="a model folder (config.json suffices)")
    parser.add_argument("--cpu-gib", type=float, default=4)
    parser.add_argument("--disk-gib", type=float, default=16)
    parser.add_argument("--arms", default="none,cpu,cpu+disk,restart,bound")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.disk, ignore_errors=True)
    args.disk.mkdir(parents=True)
    rng = random.Random(0)
    docs = [[rng.randrange(1000, 100000) for _ in range(args.doc_tokens)] for _ in range(args.docs)]
    doc_bytes = args.doc_tokens * KV_BYTES_PER_TOKEN
    result: dict[str, Any] = {
        "options": vars(args) | {"out": str(args.out), "disk": str(args.disk)},
        "doc_kv_bytes": doc_bytes,
        "disk_read": disk_read_gb_per_s(args.disk),
        "arms": {},
    }
    print("disk read", result["disk_read"], flush=True)
    pool = ["--gpu-kv-cache-memory-bytes", str(args.pool_tokens * KV_BYTES_PER_TOKEN)]
    cpu = ["--kv-offload-backend", "native", "--kv-offload-cpu-tier-gib", str(args.cpu_gib)]
    disk = ["--kv-offload-disk-path", str(args.disk)]
    bound_gib = result["bound_gib"] = round(args.docs * doc_bytes / 3 / 2**30, 2)
    arms: dict[str, tuple[list[str], tuple[int, ...]]] = {  # flags, passes
        "none": (["--kv-offload-backend", "none"], (1, 2)),
        "cpu": (cpu, (1, 2)),
        "cpu+disk": (cpu + disk + ["--kv-offload-disk-gib", str(args.disk_gib)], (1, 2)),
        "restart": (cpu + disk + ["--kv-offload-disk-gib", str(args.disk_gib)], (2,)),
        "bound": (cpu + disk + ["--kv-offload-disk-gib", str(bound_gib)], (1,)),
    }
    for name in args.arms.split(","):
        flags, passes = arms[name]
        if name == "bound":
            disk_layout.clear_tier(str(args.disk))
        server = ServerProcess(
            serve_args=["--model", args.model, *pool, *flags, "--", *DUMMY],
            log_path=args.out / f"{name.replace('+', '-')}.log",
        )
        arm: dict[str, Any] = {"flags": flags}
        result["arms"][name] = arm
        server.start()
        try:
            arm["healthy_s"] = server.wait_healthy()
            http = httpx.Client(base_url=server.base_url, timeout=600)
            for number in passes:
                ttfts, sizes = [], []
                for doc in docs:
                    began = time.perf_counter()
                    response = http.post(
                        "/v1/completions", json={"model": "m", "prompt": doc, "max_tokens": 1}
                    )
                    response.raise_for_status()
                    ttfts.append(time.perf_counter() - began)
                    sizes.append(tier_bytes(args.disk))
                arm[f"pass{number}_ttft_s"] = ttfts
                arm[f"pass{number}_disk_bytes_after_each"] = sizes
                print(
                    name,
                    f"pass {number}",
                    "median TTFT",
                    round(statistics.median(ttfts) * 1000, 1),
                    "ms; disk",
                    round(sizes[-1] / 2**30, 2),
                    "GiB",
                    flush=True,
                )
            time.sleep(3)  # stores in flight land
            arm["disk_bytes_at_end"] = tier_bytes(args.disk)
            metrics = http.get("/metrics").text
            lines = metrics.splitlines()
            arm["metric_lines"] = [x for x in lines if "kv_offload" in x and x[0] != "#"]
        except Exception as exc:  # record and go on: the other arms still measure
            arm["error"] = repr(exc)
            print(name, "failed:", exc, flush=True)
        finally:
            server.stop()
        # after every arm: a call cut short still leaves what was measured
        (args.out / "disk_tier.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
