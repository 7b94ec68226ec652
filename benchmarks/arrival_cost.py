#!/usr/bin/env python3
"""What a long prompt's arrival costs the steps beside it, on the CPU (issue #54, fair10:
chats streaming beside a 60,000-token request saw 50-64 ms gaps as it arrived, before it
was scheduled). Three parts of vLLM's own path, on the installed vLLM:

- the API server's validation of the completion body (``CompletionRequest``);
- the engine's input thread: the msgpack decode of the token ids and the ``Request`` with
  its block hashes (sha256, vLLM's default, 16-token blocks);
- a stand-in engine loop (a step of 2 ms of Python and two 2 ms waits that release the
  lock, as for the GPU) beside three such arrivals in another thread, at Python's default
  switch interval (5 ms) and at 0.5 ms: the worst step and the steps over 10 ms.

    .venv/bin/python benchmarks/arrival_cost.py [--tokens 60000] [--rounds 5] --out FILE
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
from vllm import SamplingParams
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request


def busy(seconds: float) -> None:
    """Python work that holds the interpreter lock."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def step() -> None:
    busy(0.001)
    time.sleep(0.002)
    busy(0.0005)
    time.sleep(0.002)
    busy(0.0005)


def timed(work: Callable[[], object], rounds: int) -> dict[str, float]:
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return {
        "median_ms": 1000 * statistics.median(times),
        "min_ms": 1000 * min(times),
        "max_ms": 1000 * max(times),
    }


def beside_arrivals(arrive: Callable[[], object], interval: float) -> dict[str, Any]:
    sys.setswitchinterval(interval)
    alone = []
    for _ in range(100):
        began = time.perf_counter()
        step()
        alone.append(time.perf_counter() - began)

    def three() -> None:
        for _ in range(3):
            time.sleep(0.1)
            arrive()

    thread = threading.Thread(target=three)
    thread.start()
    steps = []
    while thread.is_alive():
        began = time.perf_counter()
        step()
        steps.append(time.perf_counter() - began)
    return {
        "switch_interval_ms": 1000 * interval,
        "step_alone_median_ms": 1000 * statistics.median(alone),
        "step_beside_median_ms": 1000 * statistics.median(steps),
        "step_beside_max_ms": 1000 * max(steps),
        "steps_over_10ms": sum(s > 0.010 for s in steps),
        "steps": len(steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ids = [random.randrange(1000, 100000) for _ in range(args.tokens)]
    body = json.dumps({"model": "m", "prompt": ids, "max_tokens": 48, "stream": True})
    blob = msgspec.msgpack.encode(ids)
    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(16, sha256)

    def engine_input() -> Request:
        return Request(
            "long",
            msgspec.msgpack.decode(blob),
            SamplingParams(max_tokens=4),
            None,
            block_hasher=hasher,
        )

    default = sys.getswitchinterval()
    result = {
        "host": platform.processor() or platform.machine(),
        "tokens": args.tokens,
        "api_validation": timed(
            lambda: CompletionRequest.model_validate(json.loads(body)), args.rounds
        ),
        "engine_input": timed(engine_input, args.rounds),
        "loop_beside_arrivals": [
            beside_arrivals(engine_input, interval) for interval in (default, 0.0005) * args.rounds
        ],
    }
    sys.setswitchinterval(default)
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
