#!/usr/bin/env python3
"""Start one server through `vllm-offload serve`, measure what it takes, stop it.

    benchmarks/server_memory.py --name tier40 --out results/ -- --model DIR \
        --kv-offload-cpu-tier-gib 40 -- --load-format dummy --skip-tokenizer-init

Records: start-to-healthy seconds; host RAM taken (drop of MemAvailable from just
before the start to 5 s after healthy); the plan (`vllm-offload plan --json` with
the same flags); what vLLM logged about the KV pool, the CPU tier and weight
offload; one token-id completion as a smoke test. Writes OUT/NAME.json and
OUT/NAME.log and prints a one-line summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from vllm_offload.bench.server_process import (
    GIB,
    VLLM_OFFLOAD,
    free_port,
    scan_log,
    split_serve_args,
)
from vllm_offload.upstream.client import VllmClient


def smoke_request(server: VllmClient) -> int:
    body = {"model": "m", "prompt": list(range(100, 132)), "max_tokens": 8}
    return server.post("/v1/completions", body, timeout_s=120).status_code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=400)
    parser.add_argument("serve_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    ours, _sep, passthrough = split_serve_args(
        args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    )
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    ours = [*ours, "--port", str(port), "--model-served-name", "m"]
    plan = subprocess.run(
        [*VLLM_OFFLOAD, "plan", "--json", *[a for a in ours if a != "--allow-unpatched"]],
        capture_output=True,
        text=True,
    )
    log_path = args.out / f"{args.name}.log"
    before = psutil.virtual_memory().available
    began = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*VLLM_OFFLOAD, "serve", *ours, "--", *passthrough],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    healthy_s = None
    status = None
    server = VllmClient(f"http://127.0.0.1:{port}")
    try:
        with contextlib.suppress(RuntimeError, TimeoutError):  # recorded as not healthy
            server.wait_healthy(args.timeout, alive=lambda: proc.poll() is None, poll_s=0.25)
            healthy_s = time.monotonic() - began
        if healthy_s is not None:
            time.sleep(5)
            after = psutil.virtual_memory().available
            status = smoke_request(server)
        else:
            after = psutil.virtual_memory().available
    finally:
        server.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log_path.read_text(errors="replace")
    result = {
        "name": args.name,
        "serve_args": [*ours, "--", *passthrough],
        "healthy_s": round(healthy_s, 2) if healthy_s is not None else None,
        "exit_code": proc.returncode,
        "host_ram_taken_gib": round((before - after) / GIB, 3),
        "smoke_status": status,
        "plan": json.loads(plan.stdout) if plan.returncode == 0 else plan.stderr.strip(),
        **scan_log(text),
    }
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    summary = {k: v for k, v in result.items() if k not in ("plan", "serve_args")}
    print(json.dumps(summary), flush=True)
    if healthy_s is None:
        print(text[-3000:], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
