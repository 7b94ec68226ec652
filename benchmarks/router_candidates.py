#!/usr/bin/env python3
"""The two router candidates of issue #44 in front of the same two real boxes: does each send
a request only to a box serving its model, and does the API key hold at the router?

    .venv/bin/python benchmarks/router_candidates.py --vllm-router BIN --smg BIN --out FILE

Box A serves ``chat`` alone; box B ``chat`` and ``coder`` behind its front door (demo model,
vLLM on CPU, ``--enforce-eager``, one API key). Each router gets both boxes as its plain
worker list (``--worker-urls``: no manifest, nothing per model), which is how each is
started without a control API. Per router: ``--requests`` completions for each model,
counted by status; which box prefilled them (each box's prompt-token counter); and a
request with a wrong key. Installed by hand for this run (``pip install vllm-router==0.1.17``
and ``smg==1.13.0`` into their own venvs): only smg is a project dependency.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from vllm_offload.bench.server_process import free_port
from vllm_offload.config import parse, save
from vllm_offload.upstream.client import VllmClient, wait_until
from vllm_offload.upstream.metrics import PROMPT_TOKENS

KEY = "router-candidates-key"
SERVE = str(Path(sys.executable).parent / "vllm-offload")


def start_box(scratch: Path, key: Path, models: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    data: dict[str, Any] = {
        "extra_args": ["--enforce-eager"],
        "gpu": {"kv_cache_memory_bytes": 64 << 20},
        "server": {"port": port, "api_key_file": str(key)},
    }
    if len(models) == 1:
        data["model"] = {"served_name": models[0]}
    else:
        data["models"] = [{"served_name": m} for m in models]
        data["residency"] = {"runtime_dir": str(scratch / "run"), "min_resident_s": 1.0}
    scratch.mkdir(parents=True)
    save(parse(data), scratch / "config.toml")
    with (scratch / "box.log").open("wb") as log:
        proc = subprocess.Popen(
            [SERVE, "serve", "--config", str(scratch / "config.toml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, f"http://127.0.0.1:{port}"


# What each box's access log says it was sent (uvicorn's lines; the front door's are
# prefixed by the engine's name).
LOGGED = {
    "completions_404": '"POST /v1/completions HTTP/1.1" 404',
    "render": "POST /v1/completions/render ",
    "tokenize": "POST /tokenize ",
}


def logged(scratch: Path) -> dict[str, dict[str, int]]:
    counts = {}
    for box in ("a", "b"):
        text = (scratch / box / "box.log").read_text(errors="replace")
        counts[box] = {name: text.count(needle) for name, needle in LOGGED.items()}
    return counts


def prompt_tokens(url: str) -> float:
    with VllmClient(url, api_key=KEY) as box:
        return box.metrics([PROMPT_TOKENS]).get(PROMPT_TOKENS, 0.0)


def probe(url: str, boxes: dict[str, str], requests: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {KEY}"}
    found: dict[str, Any] = {}
    with httpx.Client(base_url=url, headers=headers, timeout=600) as client:
        for model in ("chat", "coder"):
            statuses: Counter[int] = Counter()
            served: Counter[str] = Counter()
            for i in range(requests):
                before = {name: prompt_tokens(u) for name, u in boxes.items()}
                body = {"model": model, "prompt": f"{i} {time.time_ns()} probe", "max_tokens": 1}
                statuses[client.post("/v1/completions", json=body).status_code] += 1
                for name, u in boxes.items():
                    # A switch on box B drops the stopped engine's counters: chat only.
                    if model == "chat" and prompt_tokens(u) > before[name]:
                        served[name] += 1
            found[model] = {"status": dict(statuses), "prefilled_by": dict(served)}
        wrong = {"Authorization": "Bearer wrong"}
        body = {"model": "chat", "prompt": "x", "max_tokens": 1}
        found["wrong_key_status"] = client.post(
            "/v1/completions", json=body, headers=wrong
        ).status_code
        found["models_listed"] = sorted(m["id"] for m in client.get("/v1/models").json()["data"])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vllm-router", required=True, help="the vllm-router executable")
    parser.add_argument("--smg", required=True, help="the smg executable")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="router-candidates-"))
    key = scratch / "api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    a, a_url = start_box(scratch / "a", key, ["chat"])
    b, b_url = start_box(scratch / "b", key, ["chat", "coder"])
    boxes = {"a": a_url, "b": b_url}
    result: dict[str, Any] = {"boxes": {"a": ["chat"], "b": ["chat", "coder"]}}
    try:
        for proc, url in ((a, a_url), (b, b_url)):
            with VllmClient(url) as box:
                box.wait_healthy(600, alive=lambda p=proc: p.poll() is None)
        for name, launch in (
            ("vllm-router 0.1.17", [args.vllm_router]),
            ("smg 1.13.0", [args.smg, "launch"]),
        ):
            port, metrics = free_port(), free_port()
            command = [
                *launch,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--worker-urls",
                a_url,
                b_url,
                "--prometheus-port",
                str(metrics),
                "--api-key",
                KEY,
            ]
            with (scratch / f"{name.split()[0]}.log").open("wb") as log:
                router = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
            url = f"http://127.0.0.1:{port}"
            try:
                with VllmClient(url, api_key=KEY) as through:
                    wait_until(lambda t=through: bool(t.models()), 300, f"{name} to list a model")
                before = logged(scratch)
                result[name] = probe(url, boxes, args.requests)
                after = logged(scratch)
                result[name]["boxes_logged"] = {
                    box: {k: after[box][k] - before[box][k] for k in LOGGED} for box in after
                }
                print(name, result[name], flush=True)
            finally:
                router.send_signal(signal.SIGTERM)
                router.wait(timeout=60)
    finally:
        for proc in (a, b):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=180)
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
