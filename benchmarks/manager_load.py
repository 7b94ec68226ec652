#!/usr/bin/env python3
"""50 dashboard pollers against the manager for 60 s: errors, /api/metrics latency
percentiles and the manager's own CPU use.

    .venv/bin/python benchmarks/manager_load.py [--pollers 50] [--seconds 60] [--out FILE]
    .venv/bin/python benchmarks/manager_load.py --openai-clients 16   # soak, issue #8

Each poller does what the page does: GET /api/metrics?since=<last> once a second with
the bearer token. Goals: 0 errors, p99 < 100 ms, manager CPU < 10 % of one core.
With --openai-clients N it also serves the demo model (vLLM on CPU) and runs N official
openai clients against it (half streaming) for the same time; goals: 0 failed requests
and no growth of the manager's memory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from vllm_offload.bench.server_process import free_port
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.model import demo as demo_model
from vllm_offload.upstream.client import VllmClient, wait_until


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def poller(
    base: str,
    token: str,
    until: float,
    latencies: list[float],
    errors: list[str],
    lock: threading.Lock,
) -> None:
    since = 0.0
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10
    ) as client:
        while time.monotonic() < until:
            began = time.perf_counter()
            try:
                response = client.get("/api/metrics", params={"since": since})
                elapsed = time.perf_counter() - began
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}")
                samples = response.json()["samples"]
                if samples:
                    since = samples[-1]["t"]
                with lock:
                    latencies.append(elapsed)
            except Exception as exc:
                with lock:
                    errors.append(repr(exc))
            time.sleep(max(0.0, 1.0 - (time.perf_counter() - began)))


def set_cpu_share(pid: int, group_nice: int) -> str:
    """Give the session that ``pid`` leads the CPU share its unit would get; what the
    kernel reports back ('' where it has no autogroups).

    Under systemd the manager's `CPUWeight=1000` against the server's default 100 is a
    10:1 share of a busy CPU, and `Nice=` only orders tasks within one unit. Off systemd,
    the kernel's autogroups (one per session) share the CPU and likewise ignore nice
    between sessions: the group nice -10 gives 9,548 : 1,024, the nearest to 10:1."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    with contextlib.suppress(OSError):
        autogroup.write_text(str(group_nice))
        return autogroup.read_text().strip()
    return ""


def pollers_process(
    base: str,
    token: str,
    until: float,
    count: int,
    results: multiprocessing.SimpleQueue[tuple[list[float], list[str]]],
    group_nice: int,
) -> None:
    """The pollers in a session of their own, with the manager's CPU share: a browser runs
    on another machine, so the server's CPU load must not slow the measuring side."""
    os.setsid()
    set_cpu_share(os.getpid(), group_nice)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    threads = [
        threading.Thread(target=poller, args=(base, token, until, latencies, errors, lock))
        for _ in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((latencies, errors))


def openai_client(
    base: str,
    streaming: bool,
    until: float,
    counts: dict[str, int],
    failures: list[str],
    lock: threading.Lock,
) -> None:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
    while time.monotonic() < until:
        try:
            if streaming:
                chunks = list(
                    client.completions.create(
                        model="m", prompt="hello world", max_tokens=16, stream=True
                    )
                )
                ok = len(chunks) > 0
            else:
                ok = (
                    client.completions.create(model="m", prompt="hello world", max_tokens=16).usage
                    is not None
                )
            key = "ok" if ok else "failed"
        except openai.APIError as exc:
            key = "failed"
            with lock:
                failures.append(repr(exc)[:300])
        with lock:
            counts[key] = counts.get(key, 0) + 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pollers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", type=Path, default=Path("artifacts/manager_load.json"))
    parser.add_argument(
        "--manager-group-nice",
        type=int,
        default=-10,
        help="the nice of the manager's autogroup, standing for its unit's CPUWeight=1000 "
        "(-10: 9.3x the server's share; 0: an equal share, as without the unit's setting)",
    )
    parser.add_argument(
        "--openai-clients",
        type=int,
        default=0,
        help="also serve the demo model and run this many openai clients",
    )
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="manager-load-"))
    model = demo_model.write(scratch / "models" / "demo")
    config = scratch / "config.toml"
    server_port = free_port()
    save(
        with_overrides(
            DeploymentConfig(),
            {
                "model.path": str(model),
                "model.served_name": "m",
                "server.port": server_port,
                "gpu.kv_cache_memory_bytes": 256 << 20,
                "extra_args": ["--enforce-eager"],
            },
        ),
        config,
    )
    server = None
    if args.openai_clients:
        server = subprocess.Popen(
            [sys.executable, "-m", "vllm_offload", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        with VllmClient(f"http://127.0.0.1:{server_port}") as vllm:
            vllm.wait_healthy(300)
    token = secrets.token_urlsafe(24)
    (scratch / "token").write_text(token)
    (scratch / "token").chmod(0o600)
    port = free_port()
    manager = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_offload",
            "manager",
            "--port",
            str(port),
            "--token-file",
            str(scratch / "token"),
            "--config",
            str(config),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    manager_autogroup = set_cpu_share(manager.pid, args.manager_group_nice)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(base + "/healthz"), 60, "the manager", poll_s=0.2)
        time.sleep(3)  # let the sampler fill a few samples
        process = psutil.Process(manager.pid)
        rss_before = process.memory_info().rss
        cpu_before = process.cpu_times()
        began = time.monotonic()
        lock = threading.Lock()
        queue: multiprocessing.SimpleQueue[tuple[list[float], list[str]]] = (
            multiprocessing.SimpleQueue()
        )
        measuring = multiprocessing.Process(
            target=pollers_process,
            args=(base, token, began + args.seconds, args.pollers, queue, args.manager_group_nice),
        )
        measuring.start()
        counts: dict[str, int] = {}
        failures: list[str] = []
        threads = [
            threading.Thread(
                target=openai_client,
                args=(
                    f"http://127.0.0.1:{server_port}",
                    i % 2 == 0,
                    began + args.seconds,
                    counts,
                    failures,
                    lock,
                ),
            )
            for i in range(args.openai_clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        latencies, errors = queue.get()
        measuring.join()
        wall = time.monotonic() - began
        cpu_after = process.cpu_times()
        cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
        rss_after = process.memory_info().rss
    finally:
        manager.terminate()
        manager.wait(timeout=30)
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    result = {
        "pollers": args.pollers,
        "seconds": round(wall, 1),
        "requests": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:5],
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(quantiles[98] * 1000, 2),
        "max_ms": round(max(latencies) * 1000, 2),
        "manager_cpu_percent_of_one_core": round(100 * cpu_s / wall, 1),
        "manager_rss_mib_before_after": [rss_before >> 20, rss_after >> 20],
        "manager_autogroup": manager_autogroup,
        "openai_clients": args.openai_clients,
        "openai_requests_ok": counts.get("ok", 0),
        "openai_requests_failed": counts.get("failed", 0),
        "openai_first_failures": failures[:5],
        "goals": {"errors": 0, "p99_ms_below": 100, "cpu_percent_below": 10},
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
