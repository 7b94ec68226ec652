"""The sampler's history is bounded: what keeps the manager's memory flat (issue #8)."""

from __future__ import annotations

import gc
import tracemalloc

from vllm_offload.manager.metrics import HISTORY_S, Sampler


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
