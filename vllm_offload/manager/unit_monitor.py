"""The server unit as the page shows it: its health (a wedged server included), and the
restarts, crashes and recoveries between polls, watched whether or not a page is open."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm_offload.config import ManagerSection
from vllm_offload.manager.metrics import Sampler
from vllm_offload.manager.wedge import Counters, WedgeWatch
from vllm_offload.systemd.control import ServiceError, ServiceStatus, Systemd

logger = logging.getLogger(__name__)
# A monitor loop that has not gone round for this long, and then not for as long again, is
# stuck (a poll takes < 1 s; UnitMonitor.stopped).
MONITOR_STALE_S = 10.0
# Server processes ending before they answer, this many within the window: a crash loop
# (systemd stops restarting at its start limit, 5 starts in 10 minutes in our unit).
CRASH_LOOP_STARTS = 3
CRASH_LOOP_WINDOW_S = 600
# vLLM's prefix on a log line: "(Worker pid=12) ERROR 11-22 05:10:08 [file.py:953] ".
VLLM_LOG_PREFIX = re.compile(r"^(?:\(\w+ pid=\d+\) )?(?:[A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\] )?")
# "RuntimeError: ...", "torch.OutOfMemoryError: ...", "Exception: ...".
EXCEPTION_MESSAGE = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception): .")


@dataclass(kw_only=True)
class ServiceWatch:
    """Changes seen between status polls: restarts, processes gone, health moving. What
    lets the page show a crash and the recovery after it."""

    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=50))
    # When server processes ended before they ever answered /health (within the window).
    failed_starts: deque[float] = field(default_factory=lambda: deque(maxlen=CRASH_LOOP_STARTS))
    _pid: int | None = None
    _pid_answered: bool = False
    _health: str | None = None

    @property
    def crash_loop(self) -> bool:
        recent = [t for t in self.failed_starts if t > time.time() - CRASH_LOOP_WINDOW_S]
        return len(recent) >= CRASH_LOOP_STARTS

    def observe(self, pid: int | None, health: str) -> str:
        """Record what changed; the health to show ('crash-loop' over 'starting'/'failed';
        'start-limit' says more: the service manager has stopped restarting it)."""
        now = round(time.time(), 1)
        was_looping = self.crash_loop
        if self._pid is not None and pid != self._pid:
            if pid is not None:
                self.events.append(
                    {"t": now, "text": f"new server process: pid {self._pid} -> {pid}"}
                )
            else:
                self.events.append({"t": now, "text": f"server process {self._pid} is gone"})
            if not self._pid_answered:
                self.failed_starts.append(now)
            self._pid_answered = False
            # A new process has not answered yet, whatever the last poll saw: its first
            # answer is a recovery of its own, even when no poll saw the gap.
            self._health = "restarted" if self._health == "healthy" else self._health
        if health == "healthy":
            self._pid_answered = True
            self.failed_starts.clear()
        looping = self.crash_loop  # a healthy server has just cleared failed_starts
        shown = "crash-loop" if looping and health != "start-limit" else health
        if looping and not was_looping:
            self.events.append(
                {
                    "t": now,
                    "text": f"crash loop: {CRASH_LOOP_STARTS} server "
                    "processes ended before answering",
                }
            )
        if self._health is not None and shown != self._health:
            self.events.append({"t": now, "text": f"{self._health} -> {shown}"})
        self._pid, self._health = pid, shown
        return shown


def last_error(lines: list[str]) -> str | None:
    """What ended the server, from its log: the last exception message, skipping the
    wrappers vLLM raises around the root cause ("... See root cause above"); else the last
    line that says error."""
    messages = [
        message
        for line in lines
        if EXCEPTION_MESSAGE.match(message := VLLM_LOG_PREFIX.sub("", line))
    ]
    root_causes = [m for m in messages if "root cause" not in m]
    if root_causes or messages:
        return (root_causes or messages)[-1]
    errors = [line for line in lines if "error" in line.lower()]
    return errors[-1] if errors else None


def health_of(unit: ServiceStatus, answers: bool) -> str:
    """healthy (the unit's process answers /health), by-hand (the unit is down and a server
    started by hand, `make serve` say, answers on the configured port), start-limit,
    starting, failed or stopped. While the unit restarts an answer is not its health (a
    sample taken before its process died)."""
    if answers and unit.main_pid is not None:
        return "healthy"
    if answers and unit.active_state in ("inactive", "failed") and not unit.start_limit_hit:
        return "by-hand"
    if unit.start_limit_hit:
        return "start-limit"
    if unit.active_state in ("active", "activating", "reloading"):
        return "starting"
    return "failed" if unit.active_state == "failed" else "stopped"


@dataclass(kw_only=True)
class UnitMonitor:
    """Polls the unit every ``interval_s`` in a daemon thread, so a crash at night is in
    the Events card in the morning and a server process that lives a few seconds is
    counted. Readers within the interval get the latest poll: any number of open pages
    cost one systemctl call per interval."""

    systemd: Systemd
    unit: str
    sampler: Sampler
    interval_s: float = 2.0
    # The [manager] settings now (read on every poll: the file is theirs, not the API's).
    limits: Callable[[], ManagerSection] = ManagerSection
    watch: ServiceWatch = field(default_factory=ServiceWatch)
    wedge: WedgeWatch = field(default_factory=WedgeWatch)
    _wedge_pid: int | None = None
    _latest: tuple[float, ServiceStatus, str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _loop_at: float = 0.0  # when the loop last went round

    def start(self) -> None:
        self._stop.clear()
        self._loop_at = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="unit-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread = None  # stopped on purpose (the manager shuts down): not a failure

    async def stopped(self) -> bool:
        """Whether the background loop, started and not stopped on purpose, no longer goes
        round: its thread died or hangs (the manager's /healthz says so). A loop later than
        the bound is given the bound again: where the host stood this process still (short
        of CPU or swapping: CI's box did for ~20 s, benchmarks/results/ci-box-freezes/), it
        was late, not stuck, and goes round as soon as its thread runs."""
        thread, bound = self._thread, max(MONITOR_STALE_S, 3 * self.interval_s)
        give_up = time.monotonic() + bound
        while thread is not None and thread is self._thread and thread.is_alive():
            if time.monotonic() - self._loop_at <= bound:
                return False
            if time.monotonic() > give_up:
                return True
            await asyncio.sleep(0.05)
        return thread is not None and thread is self._thread  # it died

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._loop_at = time.monotonic()
            try:
                self.poll()
                self._restart_if_wedged()
            except ServiceError:
                pass  # the page shows the error when asked
            except Exception:  # out of file descriptors, a bug: log it, keep watching
                logger.exception("unit monitor: the poll failed; trying again")
            self._stop.wait(self.interval_s)

    def poll(self) -> tuple[ServiceStatus, str]:
        """The unit's status now and the health to show; ServiceError if systemctl fails."""
        with self._lock:
            return self._poll_locked()

    def current(self) -> tuple[ServiceStatus, str]:
        """The latest poll if it is fresh, else a new one; readers that queued behind a
        poll take its result."""
        with self._lock:
            latest = self._latest
            if latest is not None and time.monotonic() - latest[0] < self.interval_s:
                return latest[1], latest[2]
            return self._poll_locked()

    def _poll_locked(self) -> tuple[ServiceStatus, str]:
        unit = self.systemd.status(self.unit)
        health = health_of(unit, self.sampler.server_healthy)
        if unit.main_pid != self._wedge_pid:
            self.wedge.forget()
            self._wedge_pid = unit.main_pid
        if health == "healthy":
            limits = self.limits()
            counters = Counters.from_metrics(self.sampler.fresh() or {})
            for text in self.wedge.observe(
                time.monotonic(), counters, limits.wedge_after_s, limits.stalled_load_after_s
            ):
                self._event(text)
            if self.wedge.wedged:
                health = "wedged"
        else:
            self.wedge.polled(time.monotonic())  # watched; nothing to decide from
        health = self.watch.observe(unit.main_pid, health)
        self._latest = (time.monotonic(), unit, health)
        return unit, health

    def _event(self, text: str) -> None:
        self.watch.events.append({"t": round(time.time(), 1), "text": text})

    def _restart_if_wedged(self) -> None:
        """With manager.restart_wedged, restart a wedged server, within the hourly
        allowance; each restart, and each one the allowance refused, is an event."""
        if not self.wedge.wedged:
            return  # the common case: no second read of the config file per poll
        limits = self.limits()
        if not limits.restart_wedged:
            return
        now = time.time()
        if not self.wedge.may_restart(now, limits.restart_wedged_per_hour):
            if not self.wedge.allowance_spent:
                self.wedge.allowance_spent = True
                self._event(
                    f"wedged, not restarting: {limits.restart_wedged_per_hour} "
                    "automatic restarts in the last hour "
                    "(manager.restart_wedged_per_hour); restart it by hand"
                )
            return
        self.wedge.restarts.append(now)
        self._event(f"restarting the server (manager.restart_wedged): {self.wedge.reason}")
        try:
            self.systemd.kill(self.unit)
            self.systemd.restart(self.unit)
        except ServiceError as exc:
            self._event(f"the restart failed: {exc}")
        finally:
            self.wedge.forget()
            self.changed()

    def changed(self) -> None:
        """A control action was sent: the next reader polls afresh."""
        self._latest = None
