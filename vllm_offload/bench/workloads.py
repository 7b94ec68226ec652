"""What every workload is given (one arm's ``Repeat``), and the workloads of fresh or
growing prompts: multi-turn chat, a rate sweep, decode. The reuse workload is
``bench.reuse``."""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeAlias

import httpx

from vllm_offload.bench.client import Prompt, RequestResult, complete
from vllm_offload.bench.prompts import PromptMaker

_thread_clients = threading.local()


def complete_alone(base_url: str, prompt: Prompt, max_tokens: int) -> RequestResult:
    """One request on this thread's own connection, as each concurrent client has one.
    Not a new httpx.Client per request: building one (its SSL context) takes ~38 ms of
    CPU under the GIL here, which serialised the closed loop's clients."""
    client = getattr(_thread_clients, "client", None)
    if client is None:
        client = _thread_clients.client = httpx.Client()
    return complete(client, base_url, prompt, max_tokens)


@dataclass(frozen=True, kw_only=True)
class Repeat:
    """One arm's part of one repeat, as every workload drives it: its server's URL, the
    prompt maker, the seed (the repeat's number) and the progress bar's tick."""

    base_url: str
    maker: PromptMaker
    seed: int
    progress: Callable[[], None]


def mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def first_error(results: list[dict[str, Any]]) -> str | None:
    return next((r["error"] for r in results if r["error"]), None)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def chat(
    repeat: Repeat, *, conversations: int, turns: int, turn_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """Conversations taking turns; each turn's prompt is the whole history so far. The
    assistant's words are stood in for by random tokens of the same length."""
    base_url, maker, progress = repeat.base_url, repeat.maker, repeat.progress
    rng = random.Random(repeat.seed)
    history: list[Prompt] = [maker.make(rng, turn_tokens) for _ in range(conversations)]
    per_turn: list[list[float | None]] = []
    errors = 0
    with httpx.Client() as client:
        for _turn in range(turns):
            ttfts: list[float | None] = []
            for c in range(conversations):
                result = complete(client, base_url, history[c], output_tokens)
                errors += not result.ok
                ttfts.append(result.ttft_s)
                history[c] = maker.join(
                    maker.join(history[c], maker.make(rng, output_tokens)),
                    maker.make(rng, turn_tokens),
                )
                progress()
            per_turn.append(ttfts)
    means = [mean_or_none(ttfts) for ttfts in per_turn]
    return {
        "conversations": conversations,
        "turns": turns,
        "turn_tokens": turn_tokens,
        "ttft_by_turn_s": means,
        "errors": errors,
    }


Rate: TypeAlias = float | str | None  # req/s; None: one at a time; MAX_RATE: closed loop, saturated
MAX_RATE = "max"


def sweep(
    repeat: Repeat,
    *,
    rates: list[Rate],
    seconds: float,
    prompt_tokens: int,
    output_tokens: int,
    max_concurrency: int = 64,
) -> list[dict[str, Any]]:
    """No reuse: fresh prompts at each rate. None: one request at a time, back to back;
    a number: Poisson arrivals (throughput then follows the offered load); MAX_RATE:
    ``max_concurrency`` clients back to back, the server's saturated throughput."""
    base_url, maker, progress = repeat.base_url, repeat.maker, repeat.progress
    rng = random.Random(repeat.seed)
    rng_lock = threading.Lock()
    rows = []

    def prompt() -> Prompt:
        with rng_lock:
            return maker.make(rng, prompt_tokens)

    for rate in rates:
        results: list[RequestResult] = []
        lock = threading.Lock()
        began = time.perf_counter()

        def run(
            prompt: Prompt, results: list[RequestResult] = results, lock: threading.Lock = lock
        ) -> None:
            result = complete_alone(base_url, prompt, output_tokens)
            with lock:
                results.append(result)

        def closed_loop(began: float = began) -> None:
            while time.perf_counter() - began < seconds:
                run(prompt())

        if rate is None:
            closed_loop()
        elif rate == MAX_RATE:
            with ThreadPoolExecutor(max_workers=max_concurrency) as pool:
                for _ in range(max_concurrency):
                    pool.submit(closed_loop)
        else:
            with ThreadPoolExecutor(max_workers=256) as pool:
                at = 0.0
                while at < seconds:
                    delay = began + at - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    pool.submit(run, prompt())
                    at += rng.expovariate(float(rate))
        wall = time.perf_counter() - began
        ok = [r for r in results if r.ok]
        ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
        tpots = [t for r in ok if (t := r.tpot_s) is not None]
        rows.append(
            {
                "rate_rps": rate,
                "requests": len(results),
                "errors": len(results) - len(ok),
                "output_tok_per_s": sum(r.output_tokens for r in ok) / wall,
                # Little's law: requests the server held at once, on average.
                "mean_in_flight": sum(r.latency_s for r in results) / wall,
                "ttft_p50_s": percentile(ttfts, 50),
                # Saturated clients go in waves, and the median jumps between the wave's
                # modes from one window to the next; the mean moves less.
                "ttft_mean_s": statistics.mean(ttfts) if ttfts else None,
                "ttft_p99_s": percentile(ttfts, 99),
                "tpot_p50_s": percentile(tpots, 50),
                "tpot_p99_s": percentile(tpots, 99),
                "first_error": next((r.error for r in results if not r.ok), None),
            }
        )
        progress()
    return rows


def decode(repeat: Repeat, *, batch: int, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """``batch`` requests at once, decoding ``output_tokens`` each: the decode speed that
    weight offload costs (every step reads the offloaded weights once)."""
    base_url, maker, progress = repeat.base_url, repeat.maker, repeat.progress
    rng = random.Random(repeat.seed)
    prompts = [maker.make(rng, prompt_tokens) for _ in range(batch)]

    with ThreadPoolExecutor(max_workers=batch) as pool:
        results = list(
            pool.map(lambda prompt: complete_alone(base_url, prompt, output_tokens), prompts)
        )
    progress()
    ok = [r for r in results if r.ok]
    tpots = [t for r in ok if (t := r.tpot_s) is not None]
    return {
        "batch": batch,
        "output_tokens": output_tokens,
        # Requests decode side by side, so the batch's speed is the sum of their speeds.
        "decode_tok_per_s": sum(1 / t for t in tpots if t > 0),
        "tpot_p50_s": percentile(tpots, 50),
        "errors": len(results) - len(ok),
        "first_error": first_error([r.to_json() for r in results]),
    }
