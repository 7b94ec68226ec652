#!/usr/bin/env python3
"""Start-to-healthy time of the demo server: through `vllm-offload serve` vs the bare
vLLM command that the launcher's own --dry-run prints (same flags), interleaved.

    .venv/bin/python benchmarks/launcher_overhead.py [--runs 3] [--out FILE.json]

Goal: the launcher adds <= 1 s (median of the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_offload.bench.server_process import free_port
from vllm_offload.upstream.client import VllmClient

VLLM_OFFLOAD = str(Path(sys.executable).parent / "vllm-offload")


def time_to_healthy(argv: list[str], env: dict[str, str], port: int, log: Path) -> float:
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        with VllmClient(f"http://127.0.0.1:{port}") as server:
            server.wait_healthy(600, alive=lambda: proc.poll() is None, poll_s=0.1)
        return time.monotonic() - began
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("artifacts/launcher_overhead.json"))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="launcher-overhead-"))
    model = scratch / "demo"
    subprocess.run(
        [VLLM_OFFLOAD, "demo-model", "--random", str(model)], check=True, capture_output=True
    )
    env = dict(os.environ, VLLM_CACHE_ROOT=str(scratch / "cache"), VLLM_NO_USAGE_STATS="1")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    launcher_args = [
        "serve",
        "--model",
        str(model),
        "--gpu-kv-cache-memory-bytes",
        str(64 << 20),
        "--",
        "--enforce-eager",
    ]
    results: dict[str, list[float]] = {"launcher": [], "bare": []}
    for run in range(args.runs):
        for arm in ("launcher", "bare"):
            port = free_port()
            argv = [VLLM_OFFLOAD, *launcher_args[:1], "--port", str(port), *launcher_args[1:]]
            if arm == "bare":
                dry = subprocess.run(
                    [*argv[:2], "--dry-run", *argv[2:]],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                argv = shlex.split(dry.stdout.splitlines()[0])
            seconds = time_to_healthy(argv, env, port, scratch / f"{arm}-{run}.log")
            results[arm].append(seconds)
            print(f"run {run + 1} {arm:8s} {seconds:6.2f} s to healthy", flush=True)
    summary = {arm: statistics.median(v) for arm, v in results.items()}
    added = summary["launcher"] - summary["bare"]
    print(
        f"median: launcher {summary['launcher']:.2f} s, bare {summary['bare']:.2f} s, "
        f"added {added:+.2f} s (goal <= 1 s)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"runs": results, "median_s": summary, "added_s": added, "goal_added_s": 1.0}, indent=2
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
