#!/usr/bin/env python3
"""Issue #16 on the GPU host: what `kill -9` of the API server leaves behind.

    benchmarks/gpu/kill9.py --name patched --out DIR [--serve-flag=--allow-unpatched]

Starts `vllm-offload serve` (Llama-3-8B shape, dummy weights, native CPU tier of
--tier-gib), sends one long streaming completion, and once tokens flow sends SIGKILL
to the serve process (it is vLLM's API server: the launcher runs vLLM's server
module in its own process). Then polls `nvidia-smi` every --poll-interval s for up to
--poll-seconds: the compute apps that hold GPU memory, the GPU's used memory, and
whether the server's child processes (EngineCore) are still alive. Then starts the
same server again and records whether and when it is healthy. Leftovers are killed
by pid before it returns. Writes OUT/kill9-NAME.json and the two servers' logs.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from vllm_offload.bench.server_process import ServerProcess

MODEL = "benchmarks/models/llama-3-8b"
DUMMY = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"]
MIB = 1 << 20


def smi(query: str, what: str) -> list[list[str]]:
    try:
        text = subprocess.run(
            ["nvidia-smi", f"--query-{query}={what}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line.strip()]


def gpu_state() -> dict[str, Any]:
    apps = smi("compute-apps", "pid,used_memory")
    used = smi("gpu", "memory.used")
    return {
        "apps": [{"pid": int(a[0]), "mib": int(a[1])} for a in apps if a[0].isdigit()],
        "used_mib": int(used[0][0]) if used and used[0][0].isdigit() else None,
    }


def alive(procs: list[psutil.Process]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append({"pid": p.pid, "name": p.name()})
        except psutil.NoSuchProcess:
            continue
    return out


def vllm_processes() -> list[psutil.Process]:
    """Processes on the host that are vLLM's (by process title) or a serve launcher,
    never this process or its ancestors (their command lines may name vLLM's env vars)."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            name, argv = p.info["name"] or "", p.info["cmdline"] or []
        except psutil.NoSuchProcess:
            continue
        serve = argv[1:4] == ["-m", "vllm_offload", "serve"]
        if p.pid not in mine and (serve or re.match(r"VLLM|EngineCore", name)):
            found.append(p)
    return found


def stream(port: int, state: dict[str, Any]) -> None:
    body = {
        "model": "m",
        "prompt": list(range(1000, 1512)),
        "max_tokens": 4000,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = conn.getresponse()
        state["status"] = response.status
        while True:
            line = response.readline()
            if not line:
                state["end"] = "eof"
                break
            if line.startswith(b"data:"):
                state["chunks"] = state.get("chunks", 0) + 1
    except Exception as exc:  # what the client sees when the server dies
        state["end"] = f"{type(exc).__name__}: {exc}"[:200]


def lines(log: Path, *patterns: str) -> list[str]:
    text = log.read_text(errors="replace")
    return [ln[:400] for ln in text.splitlines() if any(p in ln for p in patterns)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tier-gib", type=float, default=8)
    parser.add_argument("--serve-flag", action="append", default=[])
    parser.add_argument("--poll-seconds", type=float, default=30)
    parser.add_argument("--poll-interval", type=float, default=0.5)
    parser.add_argument("--start-timeout", type=float, default=240)
    parser.add_argument("--restart-timeout", type=float, default=180)
    opts = parser.parse_args()
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    args = [
        "--model",
        MODEL,
        "--kv-offload-backend",
        "native",
        "--kv-offload-cpu-tier-gib",
        str(opts.tier_gib),
        *opts.serve_flag,
        "--",
        *DUMMY,
    ]
    row: dict[str, Any] = {"name": opts.name, "serve_args": args, "date": time.strftime("%F")}
    row["gpu_before"] = gpu_state()
    base_mib = row["gpu_before"]["used_mib"] or 0
    first = ServerProcess(serve_args=args, log_path=out / f"kill9-{opts.name}-first.log")
    first.start()
    assert first.proc is not None
    leftovers: list[psutil.Process] = []
    try:
        row["first_healthy_s"] = round(first.wait_healthy(opts.start_timeout), 1)
        root = psutil.Process(first.proc.pid)
        children = root.children(recursive=True)
        row["api_server"] = {
            "pid": root.pid,
            "name": root.name(),
            "cmdline": " ".join(root.cmdline())[:200],
        }
        row["children"] = [{"pid": c.pid, "name": c.name()} for c in children]
        row["gpu_serving"] = gpu_state()
        state: dict[str, Any] = {}
        client = threading.Thread(target=stream, args=(first.port, state), daemon=True)
        client.start()
        began = time.monotonic()
        while state.get("chunks", 0) < 20 and time.monotonic() - began < 60 and "end" not in state:
            time.sleep(0.05)
        row["chunks_before_kill"] = state.get("chunks", 0)
        os.kill(first.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        samples = []
        apps_empty_s = mem_back_s = children_gone_s = None
        while time.monotonic() - killed < opts.poll_seconds:
            t = round(time.monotonic() - killed, 2)
            g = gpu_state()
            living = alive(children)
            samples.append(
                {
                    "t": t,
                    "apps": len(g["apps"]),
                    "used_mib": g["used_mib"],
                    "children_alive": len(living),
                }
            )
            if apps_empty_s is None and not g["apps"]:
                apps_empty_s = t
            if mem_back_s is None and g["used_mib"] is not None and g["used_mib"] < base_mib + 1024:
                mem_back_s = t
            if children_gone_s is None and not living:
                children_gone_s = t
            if None not in (apps_empty_s, mem_back_s, children_gone_s) and t > 3:
                break
            time.sleep(opts.poll_interval)
        first.proc.wait(timeout=10)  # reap the killed API server
        client.join(timeout=5)
        row["client_after_kill"] = {k: state.get(k) for k in ("status", "chunks", "end")}
        row["after_kill"] = {
            "gpu_apps_empty_s": apps_empty_s,
            "gpu_used_back_s": mem_back_s,
            "children_gone_s": children_gone_s,
            "children_alive_at_end": alive(children),
            "gpu_at_end": gpu_state(),
            "samples": samples,
        }
        leftovers = [p for p in children if alive([p])]
        second = ServerProcess(serve_args=args, log_path=out / f"kill9-{opts.name}-restart.log")
        second.start()
        try:
            row["restart_healthy_s"] = round(second.wait_healthy(opts.restart_timeout), 1)
        except (RuntimeError, TimeoutError) as exc:
            row["restart_healthy_s"] = None
            row["restart_failed"] = str(exc)
        finally:
            row["restart_exit_code"] = second.stop()
        row["restart_log"] = lines(second.log_path, "Error", "error:", "memory", "Free memory")[
            -12:
        ]
    except (RuntimeError, TimeoutError) as exc:
        row["failed"] = str(exc)
    finally:
        if first.proc.poll() is None:
            os.killpg(first.proc.pid, signal.SIGKILL)
        began = time.monotonic()
        stray = leftovers + [p for p in vllm_processes() if p not in leftovers]
        row["killed_leftovers"] = alive(stray)
        for p in stray:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(stray, timeout=15)
        while time.monotonic() - began < 30:
            used = gpu_state()["used_mib"]
            if used is None or used < base_mib + 1024:
                break
            time.sleep(0.5)
        row["cleanup_s"] = round(time.monotonic() - began, 1)
        row["gpu_after_cleanup"] = gpu_state()
    row["first_log"] = lines(first.log_path, "KV cache size", "Created mmap", "Error", "error:")
    (out / f"kill9-{opts.name}.json").write_text(json.dumps(row, indent=1) + "\n")
    summary = {k: v for k, v in row.items() if k not in ("serve_args", "restart_log", "first_log")}
    if "after_kill" in summary:
        summary["after_kill"] = {k: v for k, v in row["after_kill"].items() if k != "samples"}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
