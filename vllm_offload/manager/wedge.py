"""Is the server wedged? /health answers 200 while the engine makes no progress (vLLM's
pending KV loads have no time limit; a stopped or deadlocked EngineCore leaves the API
server answering): requests are waiting or running, and for ``wedge_after_s`` no token
was generated, no prompt finished prefill and the GPU KV cache did not move. Decided
from vLLM's own Prometheus counters, one scrape per poll.

vLLM counts a prompt's tokens only when its prefill completes, so a long chunked prefill
(minutes on a slow CPU host) shows its progress as KV blocks being allocated, chunk by
chunk (``vllm:kv_cache_usage_perc`` moves): that is progress, never a wedge.

The time without progress is the time the manager watched it: every poll counts, with
counters or not (a scrape that failed, a server not healthy), and a gap between two polls
counts as at most ``MAX_POLL_GAP_S``. A longer gap is the manager held up itself (a host
short of CPU or swapping: CI's 2-vCPU box stood whole processes still for up to ~20 s,
benchmarks/results/ci-box-freezes/), and the engine on the same host most likely stood
still with it; counted in full, one such freeze would call a healthy server wedged (and,
with ``restart_wedged``, kill its requests)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from vllm_offload.upstream import metrics as vm

# vLLM metric -> Counters field (sums over label sets; the KV-fetch gauge is per stage).
SOURCES = {
    vm.RUNNING: "running",
    vm.WAITING: "waiting",
    vm.PROMPT_TOKENS: "prompt_tokens",
    vm.GENERATION_TOKENS: "generation_tokens",
    vm.GPU_KV_USAGE: "gpu_kv_usage",
    vm.KV_LOADS_BY_STAGE: "kv_loads",
}
RESTART_WINDOW_S = 3600.0
MAX_POLL_GAP_S = 5.0  # the manager polls every 2 s (UnitMonitor.interval_s)


@dataclass(frozen=True, kw_only=True)
class Counters:
    """What one scrape of vLLM's /metrics says about progress."""

    running: float
    waiting: float
    prompt_tokens: float
    generation_tokens: float
    gpu_kv_usage: float
    kv_loads: float  # requests in an async KV load (0 where vLLM exports no such gauge)

    @classmethod
    def from_metrics(cls, scraped: dict[str, float]) -> Counters | None:
        """None unless the scrape has the counters the decision needs."""
        needed = [name for name, key in SOURCES.items() if key != "kv_loads"]
        if any(name not in scraped for name in needed):
            return None
        return cls(**{key: scraped.get(name, 0.0) for name, key in SOURCES.items()})

    @property
    def busy(self) -> bool:
        return self.running + self.waiting > 0

    def moved_since(self, before: Counters) -> bool:
        return (
            self.prompt_tokens > before.prompt_tokens
            or self.generation_tokens > before.generation_tokens
            or self.gpu_kv_usage != before.gpu_kv_usage
        )

    def describe(self) -> str:
        return (
            f"{self.running:.0f} running, {self.waiting:.0f} waiting, "
            f"{self.kv_loads:.0f} in a KV load; prompt tokens {self.prompt_tokens:.0f}, "
            f"generation tokens {self.generation_tokens:.0f}, "
            f"GPU KV cache {100 * self.gpu_kv_usage:.1f} % (all unchanged)"
        )


@dataclass(kw_only=True)
class WedgeWatch:
    """Fed one Counters per poll; says whether the server is wedged and whether loads have
    stalled, and keeps the restarts it was asked to make."""

    wedged: bool = False
    loads_stalled: bool = False
    stalled_s: float = 0.0  # how long work has been pending without progress, watched
    reason: str | None = None
    allowance_spent: bool = False  # said once per wedge: no restart left this hour
    restarts: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    _last: Counters | None = None
    _polled_at: float | None = None  # the manager's last poll, with counters or not
    _watched_s: float = 0.0  # watched since the last poll with counters
    _loads_for: float | None = None  # how long KV loads are pending without a break, watched

    def polled(self, now: float) -> None:
        """One poll of the manager's at ``now`` (monotonic), with counters or not: the time
        since the last one was watched, up to MAX_POLL_GAP_S of it."""
        if self._polled_at is not None:
            self._watched_s += min(now - self._polled_at, MAX_POLL_GAP_S)
        self._polled_at = now

    def observe(
        self, now: float, counters: Counters | None, wedge_after_s: float, load_after_s: float
    ) -> list[str]:
        """Take one poll (``now`` monotonic); the events it causes (entering or leaving
        either state). ``counters`` None: no fresh scrape this time, nothing decided."""
        self.polled(now)
        if counters is None:
            return []
        last, self._last = self._last, counters
        watched, self._watched_s = self._watched_s, 0.0
        # The clock runs only while work is pending, from the poll it first showed up in.
        if not counters.busy or last is None or not last.busy or counters.moved_since(last):
            self.stalled_s = 0.0
        else:
            self.stalled_s += watched
        if counters.kv_loads <= 0:
            self._loads_for = None
        else:
            self._loads_for = 0.0 if self._loads_for is None else self._loads_for + watched
        events = []
        wedged = counters.busy and self.stalled_s >= wedge_after_s
        if wedged and not self.wedged:
            self.reason = f"no progress for {self.stalled_s:.0f} s: {counters.describe()}"
            events.append(f"wedged: {self.reason}")
        elif self.wedged and not wedged:
            events.append("progress again: no longer wedged")
            self.reason = None
        self.wedged = wedged
        loads_for = self._loads_for or 0.0
        stalled = loads_for >= load_after_s  # load_after_s > 0: none pending is no stall
        if stalled and not self.loads_stalled:
            events.append(
                f"KV loads stalled: {counters.kv_loads:.0f} request(s) waiting on a KV load "
                f"for {loads_for:.0f} s"
            )
        elif self.loads_stalled and not stalled:
            events.append("KV loads moving again")
        self.loads_stalled = stalled
        return events

    def forget(self) -> None:
        """A new server process: its counters start again."""
        self._last = self._polled_at = self._loads_for = None
        self._watched_s = 0.0
        self.wedged = self.loads_stalled = self.allowance_spent = False
        self.stalled_s, self.reason = 0.0, None

    def restarts_within(self, now: float) -> int:
        """Automatic restarts in the hour before ``now`` (wall time)."""
        return sum(1 for t in self.restarts if t > now - RESTART_WINDOW_S)

    def may_restart(self, now: float, per_hour: int) -> bool:
        """Whether another automatic restart fits the hourly allowance."""
        return self.restarts_within(now) < per_hour


def prometheus_text(watch: WedgeWatch, healthy: bool) -> str:
    """The manager's /metrics: what it decided, in Prometheus text, named after vLLM's
    ``vllm:`` metrics under ``vllm_offload:``."""
    now = time.time()
    rows = [
        ("server_healthy", "gauge", "1 when the server answers /health.", float(healthy)),
        (
            "server_wedged",
            "gauge",
            "1 when requests are pending and nothing progresses.",
            float(watch.wedged),
        ),
        (
            "server_stalled_seconds",
            "gauge",
            "Seconds work has been pending without progress, as the manager watched "
            "(a gap of over 5 s between its polls counts as 5 s).",
            round(watch.stalled_s, 1),
        ),
        (
            "kv_loads_stalled",
            "gauge",
            "1 when requests wait on a KV load past the bound.",
            float(watch.loads_stalled),
        ),
        (
            "wedge_restarts_last_hour",
            "gauge",
            "Automatic restarts of a wedged server, last hour.",
            float(watch.restarts_within(now)),
        ),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [
            f"# HELP vllm_offload:{name} {help_text}",
            f"# TYPE vllm_offload:{name} {kind}",
            f"vllm_offload:{name} {value}",
        ]
    return "\n".join(lines) + "\n"
