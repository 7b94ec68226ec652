"""The CPU-tier card from counters as vLLM exports them (no tier runs on a CPU host; the
GPU run in docs/benchmarks.md shows real ones)."""

from __future__ import annotations

from vllm_offload.manager.tier_report import Totals, report

GIB = 1 << 30


def metrics(**values: float) -> dict[str, float]:
    names = {"served": "vllm:external_prefix_cache_hits", "gpu": "vllm:prefix_cache_hits",
             "prompt": "vllm:prompt_tokens", "prefill": "vllm:request_prefill_time_seconds_sum",
             "stored": "vllm:kv_offload_store_bytes", "loaded": "vllm:kv_offload_load_bytes",
             "usage": "vllm:kv_offload_cpu_cache_usage_perc"}  # fmt: skip
    return {names[key]: value for key, value in values.items()}


def test_served_against_computed_and_the_prefill_time_saved() -> None:
    then = Totals.from_metrics(metrics(served=1000, gpu=0, prompt=11_000, prefill=1, stored=GIB))
    now = Totals.from_metrics(metrics(served=9000, gpu=1000, prompt=30_000, prefill=2,
                                      stored=3 * GIB, loaded=GIB, usage=0.25))  # fmt: skip
    card = report(now, then, 16 * GIB, served_quiet_s=5)
    assert now.computed_tokens == 20_000
    assert card["prefill_tokens_per_s"] == 10_000  # 20,000 computed in 2 s of prefill
    assert card["filled_bytes"] == 3 * GIB and card["busy"] == 0.25
    window = card["last_10_min"]
    assert window["served_tokens"] == 8000 and window["computed_tokens"] == 10_000
    assert window["prefill_saved_s"] == 0.8 and window["store_bytes"] == 2 * GIB
    assert card["since_start"]["served_tokens"] == 9000 and card["verdict"] is None


def test_a_tier_that_stores_and_never_serves_gets_a_plain_verdict() -> None:
    now = Totals.from_metrics(metrics(served=0, prompt=50_000, prefill=5, stored=8 * GIB))
    assert report(now, None, 16 * GIB, served_quiet_s=3599)["verdict"] is None
    verdict = report(now, None, 16 * GIB, served_quiet_s=3700)["verdict"]
    assert verdict.startswith("nothing reused for 1.0 h while 8.0 GiB were stored")
    assert "kv_offload.store_threshold = 2" in verdict


def test_what_is_not_available_is_said() -> None:
    assert report(None, None, 0, 0) == {
        "available": False, "why": "this server has no CPU tier (kv_offload)"}  # fmt: skip
    assert report(None, None, GIB, 0)["why"] == "the server is not answering /metrics"
    card = report(Totals.from_metrics(metrics(prompt=10, stored=5 * GIB)), None, GIB, 0)
    assert card["filled_bytes"] == GIB  # full: it evicts to store more
    assert card["busy"] is None  # vLLM exported no transfer gauge
    assert card["prefill_tokens_per_s"] is None  # no prefill measured yet
