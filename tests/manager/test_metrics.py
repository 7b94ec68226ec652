"""The sampler's history is bounded: what keeps the manager's memory flat (issue #8);
with several models, each served model gets its own view (issue #43)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from vllm_offload.manager.metrics import (
    HISTORY_S,
    MAX_MODELS,
    VLLM_METRICS,
    Sampler,
    vllm_view,
)
from vllm_offload.upstream.client import sum_samples_by_model, totals


def test_memory_stays_flat_once_the_history_is_full() -> None:
    # Traced from the start, so the samples the full ring drops count as freed.
    tracemalloc.start()
    try:
        sampler = Sampler(server_url="http://127.0.0.1:1")  # nothing listens: host samples only
        for _ in range(HISTORY_S):
            sampler.sample_once()
        gc.collect()
        full = tracemalloc.take_snapshot()
        for _ in range(HISTORY_S):  # ten more minutes' worth
            sampler.sample_once()
        gc.collect()
        later = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in later.compare_to(full, "filename"))
    assert len(sampler.samples) == HISTORY_S
    # One sample holds ~270 bytes of dicts: unbounded, 600 more would add ~160 KB.
    assert grown < 64 * 1024, f"{grown} bytes more after {HISTORY_S} samples"


FRONT_DOOR = (  # two engines' /metrics as the front door merges them
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="chat"} 2.0\n'
    'vllm:num_requests_running{engine="0",model_name="coder"} 1.0\n'
    "# TYPE vllm:generation_tokens counter\n"
    'vllm:generation_tokens_total{engine="0",model_name="chat"} 100.0\n'
    'vllm:generation_tokens_total{engine="0",model_name="coder"} 40.0\n'
)


def test_each_served_model_gets_its_own_view() -> None:
    by_model = sum_samples_by_model(FRONT_DOOR, VLLM_METRICS)
    assert by_model["chat"]["vllm:num_requests_running"] == 2.0
    assert totals(by_model.values())["vllm:generation_tokens"] == 140.0
    later = {"vllm:generation_tokens": 130.0, "vllm:num_requests_running": 0.0}
    view = vllm_view(later, by_model["chat"], dt=2.0)
    assert view["generation_tokens_per_s"] == 15.0 and view["running"] == 0.0
    assert "generation_tokens_per_s" not in vllm_view(later, {}, dt=0.0)  # no rate yet


def test_the_per_model_views_keep_few_short_names(monkeypatch: pytest.MonkeyPatch) -> None:
    # The labels are whatever answers the server's port says: bounded, not trusted.
    answer = {f"m{i}": {"vllm:num_requests_running": 1.0} for i in range(40)}
    answer["x" * 201] = answer[""] = {"vllm:num_requests_running": 5.0}
    sampler = Sampler(server_url="http://127.0.0.1:1")
    monkeypatch.setattr(sampler, "probe_health", lambda: True)
    monkeypatch.setattr(sampler, "_scrape", lambda: answer)
    sample = sampler.sample_once()
    assert list(sample["vllm_models"]) == [f"m{i}" for i in range(MAX_MODELS)]
    assert sample["vllm"]["running"] == 50.0  # the total counts every engine
