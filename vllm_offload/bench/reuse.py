"""The reuse workload: documents read twice while the GPU pool holds only a few, so the
second pass hits the CPU tier, and bursts of CPU hits arriving at once."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from vllm_offload.bench.client import Prompt, RequestResult, complete
from vllm_offload.bench.workloads import Repeat, first_error, mean_or_none
from vllm_offload.upstream.client import VllmClient

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
        "first_error": first_error([r for p in passes for r in p])
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
