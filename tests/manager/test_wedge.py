"""The wedge decision on counters as vLLM exports them (the real server, stopped and
progressing, is in tests/e2e/test_wedge_browser.py)."""

from __future__ import annotations

import time

from vllm_offload.manager.metrics import FRESH_S, Sampler
from vllm_offload.manager.wedge import MAX_POLL_GAP_S, Counters, WedgeWatch, prometheus_text


def counters(
    prompt: float = 100,
    generated: float = 50,
    kv: float = 0.1,
    running: float = 1,
    waiting: float = 0,
    loads: float = 0,
) -> Counters:
    return Counters(
        running=running,
        waiting=waiting,
        prompt_tokens=prompt,
        generation_tokens=generated,
        gpu_kv_usage=kv,
        kv_loads=loads,
    )


def polls(
    watch: WedgeWatch, start: float, end: float, seen: Counters, after: float = 120
) -> list[str]:
    """The manager's polls every 2 s from ``start`` to ``end``, each seeing ``seen``; the
    events they caused."""
    events = []
    for t in range(int(start), int(end) + 1, 2):
        events += watch.observe(t, seen, after, 60)
    return events


def test_no_progress_with_work_pending_is_a_wedge_once_the_bound_passes() -> None:
    watch = WedgeWatch()
    assert polls(watch, 0, 118, counters()) == [] and not watch.wedged
    [event] = polls(watch, 120, 120, counters())
    assert watch.wedged and event.startswith("wedged: no progress for 120 s: 1 running")
    assert "generation tokens 50" in event
    assert watch.observe(122, counters(generated=51), 120, 60) == [
        "progress again: no longer wedged"
    ]
    assert not watch.wedged


def test_a_gap_in_the_polls_counts_as_a_few_seconds_of_stall() -> None:
    """The manager held up for 60 s (a starved host freezes it and, most likely, the engine
    beside it: CI's box did for ~20 s) is not 60 s of an engine without progress."""
    watch = WedgeWatch()
    polls(watch, 0, 4, counters(), after=10)
    assert watch.observe(64, counters(), 10, 60) == [] and not watch.wedged
    assert watch.stalled_s == 4 + MAX_POLL_GAP_S
    [event] = polls(watch, 66, 66, counters(), after=10)  # watched for 11 s
    assert event.startswith("wedged: no progress for 11 s")
    watch = WedgeWatch()
    watch.observe(0, counters(loads=1), 600, 60)
    assert watch.observe(100, counters(loads=1), 600, 60) == []  # loads: the same


def test_polls_without_counters_are_watched_time() -> None:
    """Scrapes that failed, or a server not healthy for a while: the manager polled on
    and watched; only its own hold-ups are discounted."""
    watch = WedgeWatch()
    for t in range(0, 100, 2):
        watch.observe(t, counters() if t % 20 == 0 else None, 120, 60)
    watch.polled(100)  # the server not healthy: nothing decided, the time watched
    assert watch.observe(102, counters(), 120, 60) == [] and watch.stalled_s == 102
    watch.forget()
    assert watch.observe(200, counters(), 120, 60) == [] and watch.stalled_s == 0


def test_a_sampler_held_up_keeps_a_scrape_that_decides_nothing() -> None:
    """A sampler stuck in a call (a disk's usage on a hung mount) keeps its last scrape:
    unchanged counters from it would call a healthy engine wedged."""
    sampler = Sampler(server_url="http://127.0.0.1:1")
    assert sampler.fresh() is None  # none yet
    sampler.latest, sampler.latest_at = {"vllm:num_requests_running": 1.0}, time.monotonic()
    assert sampler.fresh() == sampler.latest
    sampler.latest_at -= FRESH_S
    assert sampler.fresh() is None


def test_progress_of_any_kind_keeps_it_healthy() -> None:
    """Tokens generated, a prompt finished, or a long prefill allocating KV blocks chunk by
    chunk (vLLM counts prompt tokens only when the prefill completes)."""
    for moved in (counters(generated=51), counters(prompt=101), counters(kv=0.11)):
        watch = WedgeWatch()
        polls(watch, 0, 8, counters(), after=10)
        watch.observe(10, moved, 10, 60)
        assert not watch.wedged and watch.stalled_s == 0


def test_an_idle_server_is_never_wedged() -> None:
    watch = WedgeWatch()
    assert polls(watch, 0, 1000, counters(running=0), after=10) == [] and not watch.wedged
    watch.observe(1002, counters(running=0, waiting=2), 10, 60)  # work arrives: clock starts
    assert polls(watch, 1004, 1010, counters(running=0, waiting=2), after=10) == []
    assert watch.observe(1012, counters(running=0, waiting=2), 10, 60)[0].startswith("wedged")


def test_missing_scrape_decides_nothing_and_needs_the_counters() -> None:
    watch = WedgeWatch()
    watch.observe(0, counters(), 10, 60)
    assert watch.observe(100, None, 10, 60) == [] and not watch.wedged
    assert Counters.from_metrics({"vllm:num_requests_running": 1}) is None
    full = {
        "vllm:num_requests_running": 1,
        "vllm:num_requests_waiting": 0,
        "vllm:prompt_tokens": 5,
        "vllm:generation_tokens": 6,
        "vllm:kv_cache_usage_perc": 0.5,
    }
    assert Counters.from_metrics(full) == counters(prompt=5, generated=6, kv=0.5)


def test_loads_pending_without_a_break_stall() -> None:
    watch = WedgeWatch()
    for t in range(0, 60, 2):  # other requests generate meanwhile
        assert watch.observe(t, counters(loads=1, generated=50 + t), 600, 60) == []
    assert watch.observe(60, counters(loads=2, generated=110), 600, 60) == [
        "KV loads stalled: 2 request(s) waiting on a KV load for 60 s"
    ]
    assert not watch.wedged  # other requests progress: loads stalled, server not wedged
    assert watch.observe(62, counters(loads=0, generated=80), 600, 60) == ["KV loads moving again"]


def test_restart_allowance_per_hour_and_metrics() -> None:
    watch = WedgeWatch()
    watch.restarts.extend([0.0, 1000.0, 2000.0])
    assert not watch.may_restart(3000.0, 3) and watch.may_restart(3601.0, 3)
    text = prometheus_text(watch, healthy=True)
    assert "vllm_offload:server_wedged 0.0" in text and "vllm_offload:server_healthy 1.0" in text
    assert "# TYPE vllm_offload:wedge_restarts_last_hour gauge" in text
