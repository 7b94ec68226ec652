"""The workloads: reuse beyond the GPU pool, multi-turn chat, a rate sweep."""

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
from vllm_offload.vllm_client import VllmClient

# Token ids well inside any real vocabulary and clear of special tokens.
TOKEN_LOW, TOKEN_HIGH = 1000, 30000
WORDS = (
    "the", "cache", "holds", "blocks", "of", "tokens", "in", "host", "memory", "for",
    "later", "reuse", "by", "the", "server",
)  # fmt: skip


# Where a reused document's TTFT goes, from the server's side (sums over a pass).
PASS_METRICS = (
    "vllm:time_to_first_token_seconds_sum",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:kv_offload_load_bytes",
    "vllm:kv_offload_load_time",
    "vllm:kv_offload_store_bytes",
    "vllm:kv_offload_store_time",
)


_thread_clients = threading.local()


def complete_alone(base_url: str, prompt: Prompt, max_tokens: int) -> RequestResult:
    """One request on this thread's own connection, as each concurrent client has one.
    Not a new httpx.Client per request: building one (its SSL context) takes ~38 ms of
    CPU under the GIL here, which serialised the closed loop's clients."""
    client = getattr(_thread_clients, "client", None)
    if client is None:
        client = _thread_clients.client = httpx.Client()
    return complete(client, base_url, prompt, max_tokens)


@dataclass(frozen=True)
class PromptMaker:
    token_ids: bool
    vocab_high: int = TOKEN_HIGH

    def make(self, rng: random.Random, tokens: int) -> Prompt:
        """About ``tokens`` tokens: exact ids, or words (~1 token each)."""
        if self.token_ids:
            high = min(self.vocab_high, TOKEN_HIGH)
            return [rng.randrange(min(TOKEN_LOW, high // 2), high) for _ in range(tokens)]
        return " ".join(rng.choice(WORDS) for _ in range(tokens))

    def join(self, a: Prompt, b: Prompt) -> Prompt:
        if isinstance(a, list) and isinstance(b, list):
            return a + b
        return f"{a} {b}"


def mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def _first_error(results: list[dict[str, Any]]) -> str | None:
    return next((r["error"] for r in results if r["error"]), None)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def reuse(
    base_url: str,
    maker: PromptMaker,
    docs: int,
    doc_tokens: int,
    seed: int,
    progress: Callable[[], None],
    settle_s: float = 0.0,
) -> dict[str, Any]:
    """D documents, two passes; the GPU pool holds only a few. Also the GPU-hit floor:
    the same document sent twice (the second hits the GPU prefix cache). ``settle_s``
    before each request lets the last one's copies to the CPU tier finish, so a TTFT
    times one request alone."""
    rng = random.Random(seed)
    documents = [maker.make(rng, doc_tokens) for _ in range(docs)]
    passes: list[list[dict[str, Any]]] = []

    def one(client: httpx.Client, prompt: Prompt) -> RequestResult:
        time.sleep(settle_s)
        return complete(client, base_url, prompt, 1)

    server_side: list[dict[str, float]] = []
    with httpx.Client() as client, VllmClient(base_url, timeout_s=30) as server:
        for _ in range(2):
            results = []
            before = server.metrics(PASS_METRICS)
            for doc in documents:
                results.append(one(client, doc).to_json())
                progress()
            time.sleep(settle_s)  # the last document's stores land in this pass
            after = server.metrics(PASS_METRICS)
            server_side.append({k: (after[k] - before.get(k, 0.0)) / docs for k in after})
            passes.append(results)
        probe = maker.make(rng, doc_tokens)
        cold = one(client, probe)
        warm = one(client, probe)
    return {
        "docs": docs,
        "doc_tokens": doc_tokens,
        "passes": passes,
        "ttft_pass_s": [mean_or_none([r["ttft_s"] for r in p]) for p in passes],
        "server_per_doc": server_side,  # PASS_METRICS per document, by pass
        "gpu_hit_ttft_s": warm.ttft_s,
        "cold_ttft_s": cold.ttft_s,
        "settle_s": settle_s,
        "errors": sum(not r["ok"] for p in passes for r in p),
        "first_error": _first_error([r for p in passes for r in p]),
    }


def chat(
    base_url: str,
    maker: PromptMaker,
    conversations: int,
    turns: int,
    turn_tokens: int,
    output_tokens: int,
    seed: int,
    progress: Callable[[], None],
) -> dict[str, Any]:
    """Conversations taking turns; each turn's prompt is the whole history so far. The
    assistant's words are stood in for by random tokens of the same length."""
    rng = random.Random(seed)
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
    base_url: str,
    maker: PromptMaker,
    rates: list[Rate],
    seconds: float,
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
    progress: Callable[[], None],
    max_concurrency: int = 64,
) -> list[dict[str, Any]]:
    """No reuse: fresh prompts at each rate. None: one request at a time, back to back;
    a number: Poisson arrivals (throughput then follows the offered load); MAX_RATE:
    ``max_concurrency`` clients back to back, the server's saturated throughput."""
    rng = random.Random(seed)
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
                "ttft_p99_s": percentile(ttfts, 99),
                "tpot_p50_s": percentile(tpots, 50),
                "tpot_p99_s": percentile(tpots, 99),
                "first_error": next((r.error for r in results if not r.ok), None),
            }
        )
        progress()
    return rows


def decode(
    base_url: str,
    maker: PromptMaker,
    batch: int,
    prompt_tokens: int,
    output_tokens: int,
    seed: int,
    progress: Callable[[], None],
) -> dict[str, Any]:
    """``batch`` requests at once, decoding ``output_tokens`` each: the decode speed that
    weight offload costs (every step reads the offloaded weights once)."""
    rng = random.Random(seed)
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
        "first_error": _first_error([r.to_json() for r in results]),
    }
