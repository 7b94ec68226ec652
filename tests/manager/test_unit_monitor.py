"""ServiceWatch and UnitMonitor: what the page's Events card and health badge are made of."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.manager.conftest import UNIT
from vllm_offload.manager.metrics import Sampler
from vllm_offload.manager.unit_monitor import (
    CRASH_LOOP_STARTS,
    ServiceWatch,
    UnitMonitor,
    health_of,
    last_error,
)
from vllm_offload.systemd.control import ServiceStatus, Systemd

BIN = Path(sys.executable).parent


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


def test_the_start_limit_is_shown_over_the_crash_loop() -> None:
    watch = ServiceWatch()
    for pid in (300, 301, 302):
        watch.observe(pid, "starting")
    assert watch.observe(None, "failed") == "crash-loop"
    assert watch.observe(None, "start-limit") == "start-limit"
    assert watch.events[-1]["text"] == "crash-loop -> start-limit"


def test_health_of_a_unit_the_service_manager_gave_up_on() -> None:
    def unit(active: str, result: str = "") -> ServiceStatus:
        return ServiceStatus(
            unit="vllm",
            active_state=active,
            sub_state="dead",
            main_pid=42 if active == "active" else None,
            result=result,
        )

    assert health_of(unit("failed", "start-limit-hit"), answers=False) == "start-limit"
    assert health_of(unit("error"), answers=False) == "start-limit"  # systemctl3's word
    assert health_of(unit("failed", "exit-code"), answers=False) == "failed"
    assert health_of(unit("activating"), answers=False) == "starting"
    assert health_of(unit("inactive"), answers=False) == "stopped"
    assert health_of(unit("active"), answers=True) == "healthy"
    # Issue #14: the unit's process is gone (restarting): an answer sampled before it died,
    # or from another server on the port, is not its health.
    assert health_of(unit("activating"), answers=True) == "starting"
    # Issue #38: the unit is down and a server started by hand answers on the port.
    assert health_of(unit("inactive"), answers=True) == "by-hand"
    assert health_of(unit("failed", "exit-code"), answers=True) == "by-hand"


def test_a_restart_no_poll_saw_is_still_a_restart_and_a_recovery() -> None:
    """Issue #14 (a busy box): the old process was killed and the new one answered between
    two polls; the page must still show the restart and a '-> healthy'."""
    watch = ServiceWatch()
    assert watch.observe(100, "healthy") == "healthy"
    assert watch.observe(101, "healthy") == "healthy"
    texts = [e["text"] for e in watch.events]
    assert texts == ["new server process: pid 100 -> 101", "restarted -> healthy"]


# Lines as vLLM 0.32 logs a worker that found no weights (tests/e2e/test_faults_browser.py).
ENGINE_FAILED = """\
(Worker pid=21263) ERROR 11-22 05:10:08 [multiproc_executor.py:953]     self._prepare_weights(
(Worker pid=21263) ERROR 11-22 05:10:08 [multiproc_executor.py:953] RuntimeError: Cannot find \
any model weights with `/models/demo`
(EngineCore pid=21236) ERROR 11-22 05:10:10 [core.py:1510] EngineCore failed to start.
(EngineCore pid=21236) ERROR 11-22 05:10:10 [core.py:1510] Exception: WorkerProc \
initialization failed due to an exception in a background process. See stack trace for root \
cause.
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): \
{'EngineCore': 1}
""".splitlines()


def test_last_error_is_the_root_cause_not_its_wrappers() -> None:
    assert (
        last_error(ENGINE_FAILED)
        == "RuntimeError: Cannot find any model weights with `/models/demo`"
    )
    port = ["INFO starting", "OSError: [Errno 98] Address already in use", "INFO bye"]
    assert last_error(port) == "OSError: [Errno 98] Address already in use"
    launcher = ["vllm-offload: error: model.path: Input should be a valid string"]
    assert last_error(launcher) == launcher[0]
    assert last_error(["INFO all fine"]) is None


def test_any_number_of_readers_cost_one_systemctl_call(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    counting = tmp_path / "systemctl"  # systemctl3, counting its calls
    counting.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {BIN / "systemctl3"} "$@"\n')
    counting.chmod(0o755)
    root = tmp_path / "a" / "b" / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/vllm.service").write_text(UNIT)
    monitor = UnitMonitor(
        systemd=Systemd(systemctl=(str(counting),), journalctl=("journalctl3",), root=root),
        unit="vllm",
        sampler=Sampler(server_url="http://127.0.0.1:1"),
        interval_s=60,
    )
    with ThreadPoolExecutor(20) as pool:
        shown = list(pool.map(lambda _: monitor.current(), range(20)))
    assert {health for _unit, health in shown} == {"stopped"}
    assert len(calls.read_text().splitlines()) == 1
    monitor.changed()  # a control action: the next reader asks again
    monitor.current()
    assert len(calls.read_text().splitlines()) == 2


def test_the_monitor_survives_any_failure_and_says_when_it_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #15: out of file descriptors (EMFILE from half-open connections), the monitor
    thread died and never came back while /healthz said ok."""
    import asyncio
    import errno
    import threading
    import time

    from vllm_offload.manager import unit_monitor

    failures = iter([OSError(errno.EMFILE, "Too many open files"), RuntimeError("a bug")])
    hang, release = threading.Event(), threading.Event()

    class Flaky(Systemd):
        def status(self, unit: str) -> ServiceStatus:
            failure = next(failures, None)
            if failure is not None:
                raise failure
            if hang.is_set():
                release.wait(120)
            return ServiceStatus(
                unit=unit, active_state="inactive", sub_state="dead", main_pid=None
            )

    # Stale after 5 s (and asked again 5 s later): a loop only late goes round meanwhile.
    monkeypatch.setattr(unit_monitor, "MONITOR_STALE_S", 5.0)
    monitor = UnitMonitor(
        systemd=Flaky(),
        unit="vllm",
        sampler=Sampler(server_url="http://127.0.0.1:1"),
        interval_s=0.05,
    )
    assert not asyncio.run(monitor.stopped())  # not started: nothing to report
    monitor.start()
    try:
        deadline = time.monotonic() + 30
        while monitor._latest is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert monitor._latest is not None, "the monitor never polled again"
        assert not asyncio.run(monitor.stopped())
        # The host stood the process still for 100 s: the loop is late, not stuck.
        monitor._loop_at = time.monotonic() - 100
        assert not asyncio.run(monitor.stopped())
        hang.set()  # the loop is stuck in a call: /healthz must say so
        deadline = time.monotonic() + 60
        while not asyncio.run(monitor.stopped()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert asyncio.run(monitor.stopped())
    finally:
        release.set()
        monitor.stop()
    assert not asyncio.run(monitor.stopped())  # stopped on purpose
