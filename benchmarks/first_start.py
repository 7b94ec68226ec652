#!/usr/bin/env python3
"""How long a newcomer waits (issue #56): `vllm-offload serve` with no config (the demo
model, vLLM's compile on, as `make serve` runs it) started with an empty compile cache,
then again with the cache it left; each start's seconds to /health, to the README's
first answer, and the phases our plugin prints. Writes OUT/first_start.json.

    benchmarks/first_start.py --out benchmarks/results/cpu-host/first-start
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

import httpx

from vllm_offload.bench.server_process import ServerProcess

QUESTION = {
    "model": "smollm2-135m-instruct",
    "temperature": 0,
    "max_tokens": 16,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}
PHASE = re.compile(r"vllm-offload: start: (.*) \((\d+) s\)")


def one_start(out: Path, name: str, cache: Path) -> dict[str, object]:
    server = ServerProcess(
        serve_args=["--model-served-name", "smollm2-135m-instruct"],
        log_path=out / f"{name}.log",
        served_name=None,
        env={**os.environ, "VLLM_CACHE_ROOT": str(cache)},
    )
    server.start()
    try:
        healthy = server.wait_healthy(1800)
        asked = time.monotonic()
        answer = httpx.post(server.base_url + "/v1/chat/completions", json=QUESTION, timeout=600)
        answered = time.monotonic() - server.started_at
        text = answer.json()["choices"][0]["message"]["content"]
    finally:
        server.stop()
    phases = PHASE.findall(server.log_path.read_text(errors="replace"))
    return {
        "healthy_s": round(healthy, 1),
        "first_answer_s": round(answered, 1),
        "answer_took_s": round(answered - (asked - server.started_at), 2),
        "answer": text,
        "phases": [{"phase": p, "s": int(s)} for p, s in phases],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.out / "vllm-cache"
    shutil.rmtree(cache, ignore_errors=True)
    result = {
        "cold": one_start(args.out, "cold", cache),
        "warm": one_start(args.out, "warm", cache),
    }
    shutil.rmtree(cache, ignore_errors=True)
    (args.out / "first_start.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
