#!/usr/bin/env python3
"""Issue #17 on the GPU host: the manager's CPU-tier card and wedge counters from a real
native tier. Starts `vllm-offload serve` (Llama-3-8B shape, dummy weights, a GPU pool of
--pool-tokens so documents leave the GPU, a --tier-gib native tier), reads --docs
documents of --doc-tokens token ids twice (pass 2 comes from the CPU tier), then a
burst of unique prompts, scraping vLLM's /metrics after each phase. Writes
OUT/tier_card.json: per phase the card (manager/tier_report.report) and the wedge
counters (manager/wedge.Counters), and every vllm:kv_offload* / fetch line of the last
scrape, so what 0.32 exports is on record.

    benchmarks/gpu/tier_card.py --out DIR
"""

from __future__ import annotations

import json
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options

from vllm_offload.bench.server_process import ServerProcess
from vllm_offload.manager import tier_report, wedge
from vllm_offload.manager.metrics import VLLM_METRICS
from vllm_offload.upstream.client import sum_samples

MODEL = "benchmarks/models/llama-3-8b"
DUMMY = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"]


def main() -> None:
    parser = options.parser(__doc__, tier_gib=16, pool_tokens=32768, docs=8, doc_tokens=8000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    pool_bytes = args.pool_tokens * 128 * 1024  # Llama-3-8B: 128 KiB of KV per token
    server = ServerProcess(
        serve_args=[
            "--model",
            MODEL,
            "--kv-offload-backend",
            "native",
            "--kv-offload-cpu-tier-gib",
            str(args.tier_gib),
            "--gpu-kv-cache-memory-bytes",
            str(pool_bytes),
            "--",
            *DUMMY,
        ],
        log_path=args.out / "tier_card-server.log",
    )
    server.start()
    phases: list[dict[str, object]] = []
    try:
        server.wait_healthy()
        rng = random.Random(0)
        docs = [
            [rng.randrange(1000, 100000) for _ in range(args.doc_tokens)] for _ in range(args.docs)
        ]
        http = httpx.Client(base_url=server.base_url, timeout=600)

        def ask(prompt: list[int]) -> None:
            body = {"model": "m", "prompt": prompt, "max_tokens": 4}
            http.post("/v1/completions", json=body).raise_for_status()

        def scrape(name: str) -> str:
            text = http.get("/metrics").text
            scraped = sum_samples(text, VLLM_METRICS)
            totals = tier_report.Totals.from_metrics(scraped)
            tier_bytes = int(args.tier_gib * (1 << 30))
            phases.append(
                {
                    "phase": name,
                    "card": tier_report.report(totals, None, tier_bytes, served_quiet_s=0),
                    "counters": asdict(c) if (c := wedge.Counters.from_metrics(scraped)) else None,
                }
            )
            print(name, json.dumps(phases[-1]), flush=True)
            return text

        for doc in docs:
            ask(doc)
        scrape("pass 1: documents computed")
        for doc in docs:
            ask(doc)
        scrape("pass 2: documents again (from the CPU tier)")
        with ThreadPoolExecutor(16) as pool:
            list(
                pool.map(
                    ask, [[rng.randrange(1000, 100000) for _ in range(2000)] for _ in range(64)]
                )
            )
        text = scrape("burst: 64 unique prompts")
        lines = [
            line
            for line in text.splitlines()
            if "kv_offload" in line or "fetch" in line or "prefill_time" in line
        ]
        (args.out / "tier_card.json").write_text(
            json.dumps({"phases": phases, "metric_lines": lines}, indent=1) + "\n"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
