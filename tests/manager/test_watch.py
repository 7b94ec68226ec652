"""ServiceWatch: what the page's Events card and health badge are made of."""

from __future__ import annotations

from vllm_offload.manager.app import CRASH_LOOP_STARTS, ServiceWatch


def test_restarts_that_answer_are_not_a_crash_loop() -> None:
    watch = ServiceWatch()
    for pid in range(100, 100 + 2 * CRASH_LOOP_STARTS):  # restarted from the page, each healthy
        assert watch.observe(pid, "starting") == "starting"
        assert watch.observe(pid, "healthy") == "healthy"
    assert not watch.crash_loop
    assert any("new server process: pid 100 -> 101" in e["text"] for e in watch.events)


def test_processes_ending_before_they_answer_are_a_crash_loop() -> None:
    watch = ServiceWatch()
    assert watch.observe(200, "starting") == "starting"
    assert watch.observe(None, "stopped") == "stopped"  # 200 died without answering: 1
    assert watch.observe(201, "starting") == "starting"
    assert watch.observe(202, "starting") == "starting"  # 201 replaced unanswered: 2
    assert watch.observe(None, "failed") == "crash-loop"  # 202: 3, and the unit gave up
    texts = [e["text"] for e in watch.events]
    assert "server process 202 is gone" in texts
    assert f"crash loop: {CRASH_LOOP_STARTS} server processes ended before answering" in texts
    assert texts[-1] == "starting -> crash-loop"
    # started again by hand, and this time it answers: the loop is over
    assert watch.observe(203, "starting") == "crash-loop"
    assert watch.observe(203, "healthy") == "healthy"
    assert not watch.crash_loop and watch.events[-1]["text"] == "crash-loop -> healthy"
