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
    "the",
    "cache",
    "holds",
    "blocks",
    "of",
    "tokens",
    "in",
    "host",
    "memory",
    "for",
    "later",
    "reuse",
    "by",
    "the",
    "server",
)


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


# A burst also says where its tokens came from: the GPU prefix cache or the CPU tier.
BURST_METRICS = (
    *PASS_METRICS,
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:external_prefix_cache_hits",
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


@dataclass(frozen=True, kw_only=True)
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


def _first_error(results: list[dict[str, Any]]) -> str | None:
    return next((r["error"] for r in results if r["error"]), None)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def reuse(
    repeat: Repeat,
    *,
    docs: int,
    doc_tokens: int,
    settle_s: float = 0.0,
    hit_concurrency: tuple[int, ...] = (),
) -> dict[str, Any]:
    """D documents, two passes; the GPU pool holds only a few. Also the GPU-hit floor:
    the same document sent twice (the second hits the GPU prefix cache). ``settle_s``
    before each request lets the last one's copies to the CPU tier finish, so a TTFT
    times one request alone. Then a ``hit_burst`` for each of ``hit_concurrency``: that
    many CPU hits at once (the server needs VLLM_SERVER_DEV_MODE=1, and a GPU pool that
    holds that many documents)."""
    base_url, maker, progress = repeat.base_url, repeat.maker, repeat.progress
    rng = random.Random(repeat.seed)
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
        bursts = []
        for n in hit_concurrency:
            new = [maker.make(rng, doc_tokens) for _ in range(n)]
            bursts.append(hit_burst(base_url, server, new, doc_tokens, settle_s))
            progress()
    return {
        "docs": docs,
        "doc_tokens": doc_tokens,
        "passes": passes,
        "ttft_pass_s": [mean_or_none([r["ttft_s"] for r in p]) for p in passes],
        "server_per_doc": server_side,  # PASS_METRICS per document, by pass
        "gpu_hit_ttft_s": warm.ttft_s,
        "cold_ttft_s": cold.ttft_s,
        "settle_s": settle_s,
        "bursts": bursts,
        "errors": sum(not r["ok"] for p in passes for r in p) + sum(b["errors"] for b in bursts),
        "first_error": _first_error([r for p in passes for r in p])
        or next((b["first_error"] for b in bursts if b["first_error"]), None),
    }


# How long a burst waits for vLLM to drop its GPU prefix cache: the reset fails while
# blocks are held (stores to the CPU tier in flight), so it is tried again.
RESET_TIMEOUT_S = 30.0


def reset_gpu_prefix_cache(server: VllmClient, timeout_s: float = RESET_TIMEOUT_S) -> float:
    """Drop the GPU prefix cache, keep the CPU tier (vLLM's dev route, on where the server
    runs with VLLM_SERVER_DEV_MODE=1); seconds it took. RuntimeError if the route is
    missing or the reset never succeeds."""
    began = time.perf_counter()
    while True:
        response = server.post("/reset_prefix_cache", {}, timeout_s=timeout_s)
        if response.status_code == 404:
            raise RuntimeError(
                "no /reset_prefix_cache: start the server with VLLM_SERVER_DEV_MODE=1"
            )
        response.raise_for_status()
        if response.json().get("success"):
            return time.perf_counter() - began
        if time.perf_counter() - began > timeout_s:
            raise RuntimeError(f"the GPU prefix cache was not reset in {timeout_s:.0f} s")
        time.sleep(0.05)


def _at_once(base_url: str, prompts: list[Prompt]) -> tuple[list[RequestResult], float]:
    """All prompts sent together (one thread each, released by a barrier); the results in
    order and the seconds from the first send to the last first token (or end)."""
    gate = threading.Barrier(len(prompts))

    def send(prompt: Prompt) -> tuple[float, RequestResult]:
        with httpx.Client() as client:  # made before the gate, not inside the burst
            gate.wait()
            return time.perf_counter(), complete(client, base_url, prompt, 1)

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        sent = list(pool.map(send, prompts))
    first = min(at for at, _ in sent)
    last = max(at + (r.ttft_s if r.ttft_s is not None else r.latency_s) for at, r in sent)
    return [r for _, r in sent], last - first


def hit_burst(
    base_url: str,
    server: VllmClient,
    documents: list[Prompt],
    doc_tokens: int,
    settle_s: float,
) -> dict[str, Any]:
    """New ``documents`` (``doc_tokens`` each) read at once (cold), the GPU prefix cache
    dropped (the CPU tier keeps them), then read again at once: CPU hits arriving together;
    then once more: GPU hits together, the floor's first part. The server's counters over
    each burst say how many bytes the CPU tier loaded and how long its copies took."""
    cold, _ = _at_once(base_url, documents)
    time.sleep(settle_s)  # their stores to the CPU tier land
    reset_s = reset_gpu_prefix_cache(server)
    phases: dict[str, Any] = {}
    for phase in ("cpu_hit", "gpu_hit"):
        before = server.metrics(BURST_METRICS)
        results, wall = _at_once(base_url, documents)
        time.sleep(settle_s)  # counters of copies that end after the first token
        after = server.metrics(BURST_METRICS)
        phases[phase] = {
            "ttft_s": [r.ttft_s for r in results],
            "wall_s": wall,
            "server": {k: after[k] - before.get(k, 0.0) for k in after},  # sums, not per doc
            "errors": sum(not r.ok for r in results),
            "first_error": next((r.error for r in results if not r.ok), None),
        }
    loaded = phases["cpu_hit"]["server"].get("vllm:kv_offload_load_bytes", 0.0)
    load_time = phases["cpu_hit"]["server"].get("vllm:kv_offload_load_time", 0.0)
    return {
        "concurrency": len(documents),
        "doc_tokens": doc_tokens,
        "cold_ttft_s": [r.ttft_s for r in cold],
        "reset_s": reset_s,
        **phases,
        # bytes over the summed copy times of the loads (they run one after another)
        "load_gbps": loaded / load_time / 1e9 if load_time else None,
        "errors": sum(not r.ok for r in cold) + sum(p["errors"] for p in phases.values()),
        "first_error": next((r.error for r in cold if not r.ok), None)
        or next((p["first_error"] for p in phases.values() if p["first_error"]), None),
    }


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
        "first_error": _first_error([r.to_json() for r in results]),
    }
