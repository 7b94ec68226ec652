#!/usr/bin/env python3
"""What the router in front of several boxes (smg, issue #44) adds to a request: the same
requests sent straight to a box and through the router, in interleaved windows.

    .venv/bin/python benchmarks/router_latency.py [--windows 8] [--requests 20] --out FILE

One box: `vllm-offload serve` of the demo model (vLLM on CPU, `--enforce-eager`), the
router configured by `cluster_router` with that box as its only worker (so both arms reach
the same engine and differ only by the router). Each window sends, per arm (order
alternating between windows), ``--requests`` sequential completions of a fresh prompt
with ``max_tokens=1`` (prefill plus one token: the request's fixed costs show most), then
``--stream-requests`` streamed ones (time to first token). Reported per arm: the medians
of the windows' medians with min-max, and per window the router's added time.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from vllm_offload import cluster_router
from vllm_offload.bench.server_process import free_port
from vllm_offload.config import ClusterBox, ClusterSection, DeploymentConfig, parse, save
from vllm_offload.upstream.client import VllmClient, wait_until

KEY = "router-bench-key"
SERVE = str(Path(sys.executable).parent / "vllm-offload")


def prompt(window: int, arm: str, i: int) -> str:
    """A fresh ~60-token prompt (no prefix cache hit in either arm)."""
    return f"{arm} {window} {i}: " + " ".join(
        f"word{(window * 97 + i * 13 + k) % 1000}" for k in range(40)
    )


def one(client: httpx.Client, text: str) -> float:
    began = time.perf_counter()
    answer = client.post(
        "/v1/completions", json={"model": "chat", "prompt": text, "max_tokens": 1, "temperature": 0}
    )
    answer.raise_for_status()
    return time.perf_counter() - began


def first_token(client: httpx.Client, text: str) -> float:
    body = {
        "model": "chat",
        "prompt": text,
        "max_tokens": 8,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    began = time.perf_counter()
    with client.stream("POST", "/v1/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: {"):
                return time.perf_counter() - began
    raise RuntimeError("a stream without a token")


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(values) * 1000, 2),
        "min_ms": round(min(values) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def measure(urls: dict[str, str], windows: int, requests: int, streams: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    clients = {
        arm: httpx.Client(base_url=url, headers=headers, timeout=300) for arm, url in urls.items()
    }
    per_window: dict[str, dict[str, list[float]]] = {arm: {"seq": [], "ttft": []} for arm in urls}
    for arm, client in clients.items():  # warm both paths (connections, the engine)
        for i in range(3):
            one(client, prompt(-1, arm, i))
    for w in range(windows):
        order = list(clients.items())[:: 1 if w % 2 else -1]
        for arm, client in order:
            seq = [one(client, prompt(w, arm, i)) for i in range(requests)]
            ttft = [first_token(client, prompt(w, arm + "s", i)) for i in range(streams)]
            per_window[arm]["seq"].append(statistics.median(seq))
            per_window[arm]["ttft"].append(statistics.median(ttft))
            print(
                f"window {w} {arm}: seq {statistics.median(seq) * 1000:.2f} ms, "
                f"ttft {statistics.median(ttft) * 1000:.2f} ms",
                flush=True,
            )
    result: dict[str, Any] = {}
    for kind in ("seq", "ttft"):
        added = [
            r - d
            for r, d in zip(per_window["router"][kind], per_window["direct"][kind], strict=True)
        ]
        result[kind] = {
            "direct": summary(per_window["direct"][kind]),
            "router": summary(per_window["router"][kind]),
            "router_added": summary(added),
            "windows_ms": {
                arm: [round(v * 1000, 2) for v in per_window[arm][kind]] for arm in urls
            },
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--stream-requests", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="router-bench-"))
    key_file = scratch / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    port = free_port()
    config = scratch / "config.toml"
    save(
        parse(
            {
                "extra_args": ["--enforce-eager"],
                "gpu": {"kv_cache_memory_bytes": 64 << 20},
                "server": {"port": port, "api_key_file": str(key_file)},
                "model": {"served_name": "chat"},
            }
        ),
        config,
    )
    cluster = ClusterSection(
        router_port=free_port(),
        metrics_port=free_port(),
        api_key_file=str(key_file),
        boxes=[ClusterBox(name="a", url=f"http://127.0.0.1:{port}", models=["chat"])],
    )
    router_config = scratch / "router.toml"
    save(DeploymentConfig(cluster=cluster), router_config)
    command = cluster_router.command(sys.executable, router_config, scratch / "workers.json")
    with (scratch / "box.log").open("wb") as box_log:
        box = subprocess.Popen(
            [SERVE, "serve", "--config", str(config)],
            stdout=box_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    urls = {
        "direct": f"http://127.0.0.1:{port}",
        "router": f"http://127.0.0.1:{cluster.router_port}",
    }
    router: subprocess.Popen[bytes] | None = None
    try:
        with VllmClient(urls["direct"]) as server:
            server.wait_healthy(600, alive=lambda: box.poll() is None)
        with (scratch / "router.log").open("wb") as router_log:
            router = subprocess.Popen(
                command, stdout=router_log, stderr=subprocess.STDOUT, start_new_session=True
            )
        with VllmClient(urls["router"], api_key=KEY) as through:
            wait_until(lambda: through.models() == ["chat"], 300, "the router to list chat")
        result = measure(urls, args.windows, args.requests, args.stream_requests)
    finally:
        for proc in (router, box):
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
    result |= {
        "windows": args.windows,
        "requests_per_window": args.requests,
        "stream_requests_per_window": args.stream_requests,
        "router": "smg 1.13.0",
        "box": "vllm-offload serve, demo model, vLLM CPU, --enforce-eager",
        "host": f"{platform.node()} {platform.processor() or platform.machine()}, "
        f"{__import__('os').cpu_count()} CPUs (shared)",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("seq", "ttft")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
