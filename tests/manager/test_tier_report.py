"""The CPU-tier card from counters as vLLM exports them (no tier runs on a CPU host; the
GPU run in docs/benchmarks.md shows real ones)."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_offload.manager.tier_report import Totals, disk_report, report

GIB = 1 << 30
RESULTS = Path(__file__).parents[2] / "benchmarks/results/h200-vllm-0.32.0"


def metrics(**values: float) -> dict[str, float]:
    names = {
        "served": "vllm:external_prefix_cache_hits",
        "gpu": "vllm:prefix_cache_hits",
        "prompt": "vllm:prompt_tokens",
        "prefill": "vllm:request_prefill_time_seconds_sum",
        "stored": "vllm:kv_offload_store_bytes",
        "loaded": "vllm:kv_offload_load_bytes",
        "usage": "vllm:kv_offload_cpu_cache_usage_perc",
    }
    return {names[key]: value for key, value in values.items()}


def test_served_against_computed_and_the_prefill_time_saved() -> None:
    then = Totals.from_metrics(metrics(served=1000, gpu=0, prompt=11_000, prefill=1, stored=GIB))
    now = Totals.from_metrics(
        metrics(
            served=9000, gpu=1000, prompt=30_000, prefill=2, stored=3 * GIB, loaded=GIB, usage=0.25
        )
    )
    card = report(now, then, 16 * GIB, served_quiet_s=5)
    assert now.computed_tokens == 20_000
    assert card["prefill_tokens_per_s"] == 10_000  # 20,000 computed in 2 s of prefill
    assert card["filled_bytes"] == 3 * GIB and card["busy"] == 0.25
    window = card["last_10_min"]
    assert window["served_tokens"] == 8000 and window["computed_tokens"] == 10_000
    assert window["prefill_saved_s"] == 0.8 and window["store_bytes"] == 2 * GIB
    assert card["since_start"]["served_tokens"] == 9000 and card["verdict"] is None
    # The hit rate: tier hits among all prompt tokens, over each span.
    assert window["prompt_tokens"] == 19_000 and window["hit_rate"] == 8000 / 19_000
    assert card["since_start"]["hit_rate"] == 0.3  # 9,000 of 30,000


def test_a_tier_that_stores_and_never_serves_gets_a_plain_verdict() -> None:
    now = Totals.from_metrics(metrics(served=0, prompt=50_000, prefill=5, stored=8 * GIB))
    assert report(now, None, 16 * GIB, served_quiet_s=3599)["verdict"] is None
    verdict = report(now, None, 16 * GIB, served_quiet_s=3700)["verdict"]
    assert verdict.startswith("nothing reused for 1.0 h while 8.0 GiB were stored")
    assert "kv_offload.store_threshold = 2" in verdict


def test_what_is_not_available_is_said() -> None:
    assert report(None, None, 0, 0) == {
        "available": False,
        "size_bytes": 0,  # the page says "No CPU tier"
        "why": "this server has no CPU tier (kv_offload)",
    }
    assert report(None, None, GIB, 0)["why"] == "the server is not answering /metrics"
    card = report(Totals.from_metrics(metrics(prompt=10, stored=5 * GIB)), None, GIB, 0)
    assert card["filled_bytes"] == GIB  # full: it evicts to store more
    assert card["busy"] is None  # vLLM exported no transfer gauge
    assert card["prefill_tokens_per_s"] is None  # no prefill measured yet
    idle = report(Totals.from_metrics(metrics(stored=GIB)), None, GIB, 0)
    assert idle["last_10_min"]["hit_rate"] is None  # no prompt yet: no rate


def test_the_disk_tier_card_from_what_vllm_exported_on_the_h200() -> None:
    """Counter lines as vLLM 0.32 exported them with the disk tier on the H200
    (benchmarks/results/h200-vllm-0.32.0/disk-tier/short/disk_tier.json, cpu+disk arm):
    8.59 GB read from disk in 5.83 s of transfers, 13.39 GB written in 13.17 s."""
    from vllm_offload.manager.metrics import parse_vllm_metrics

    raw = RESULTS / "disk-tier/short/disk_tier.json"
    text = "\n".join(json.loads(raw.read_text())["arms"]["cpu+disk"]["metric_lines"]) + "\n"
    now = Totals.from_metrics(parse_vllm_metrics(text))
    card = disk_report(now, None, 16 * GIB, {"used_bytes": 11.6 * GIB, "evicted_bytes": 0})
    since = card["since_start"]
    assert since["read_bytes"] == 8.589934592e9 and since["write_bytes"] == 1.3388218368e10
    assert round(since["read_bytes_per_s"] / 1e9, 2) == 1.47
    assert round(since["write_bytes_per_s"] / 1e9, 2) == 1.02
    assert card["held_bytes"] == 11.6 * GIB and card["size_bytes"] == 16 * GIB
    assert disk_report(now, None, 0, None)["why"].startswith("this server has no disk tier")
    assert disk_report(now, None, GIB, None)["held_bytes"] is None  # not reported yet
