"""How a request whose KV reaches the pool's host blocks shares the GPU with the others
(issue #42): pure, the clock injected; ``fair_scheduler`` is its seat in vLLM's
scheduler.

Every step that includes such a request waits for its host reads (~0.14 s for 6 GB over
PCIe), and so does every request batched with it. Two rules keep the others at GPU
speed:

- **A time share.** While other requests are waiting or running, the steps that include
  a spilled request take at most ``share`` of wall time, their host reads included: after
  such a step of ``t`` seconds, the next one may start ``t * (1 - share) / share`` seconds
  later, and the steps in between run without it. Alone, it runs every step.
- **One request holds at most half the GPU part.** Past that, its new blocks come from
  host RAM first, so that a short request arriving later still finds GPU blocks instead
  of host blocks that were free first (the GPU part full of the long request's blocks;
  cached free GPU blocks are evicted before any host block is handed out anyway:
  DeviceFirstFreeBlockQueue). Alone, such a request reads up to half the GPU part more
  over PCIe every step.

A share of 1 turns both off: patch 0006 alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The most of the pool's GPU part one request holds before its new blocks come from host RAM.
MAX_GPU_PART_OF_ONE_REQUEST = 0.5


def read_share(value: object) -> float:
    """The share from --additional-config; ValueError names the fix."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(
            f"--additional-config kv_spilled_step_share must be a number in (0, 1], not {value!r}"
        )
    return float(value)


def host_first(gpu_blocks_held: int, gpu_blocks: int) -> bool:
    """Whether a request holding this many of the pool's GPU blocks takes host ones first."""
    return gpu_blocks_held >= gpu_blocks * MAX_GPU_PART_OF_ONE_REQUEST


@dataclass(frozen=True)
class Step:
    """A step scheduled and not yet ended: when it was scheduled, whether it includes a
    spilled request."""

    key: object
    at: float
    spilled: bool


@dataclass(kw_only=True)
class SpillShare:
    """The time-share rule. Call ``admit`` when a step is being scheduled, ``started``
    once it is (with a key for it and whether it includes a spilled request), and
    ``ended`` with that key when its output arrives; steps end in the order they were
    scheduled.

    A step's length is the time from the later of its scheduling and the previous step's
    end to its own end. Not the time between two schedulings: with async scheduling
    (vLLM 0.33's default on CUDA) vLLM schedules a step while the one before it runs, so
    that gap is ~0 after one step and two steps long after the next; measured on the GPU,
    a spilled request got into every other step, 92 % of the time at a share of 0.25.
    For the same reason no spilled step is admitted while another is still running: it
    would be scheduled before the first one's length is known."""

    share: float
    clock: Callable[[], float] = time.monotonic
    _running: list[Step] = field(default_factory=list, init=False)
    _last_end: float = field(default=-math.inf, init=False)
    _not_before: float = field(default=-math.inf, init=False)

    def admit(self, *, others: bool) -> bool:
        """Whether the spilled requests go into the step now scheduled; ``others``:
        whether any other request is running or waiting."""
        if not others:
            return True
        return self.clock() >= self._not_before and not any(s.spilled for s in self._running)

    def started(self, key: object, *, spilled: bool) -> None:
        self._running.append(Step(key=key, at=self.clock(), spilled=spilled))

    def ended(self, key: object) -> None:
        at = next((n for n, s in enumerate(self._running) if s.key is key), None)
        if at is None:
            return
        step, now = self._running[at], self.clock()
        del self._running[: at + 1]  # any before it ended unseen (steps end in order)
        took = now - max(step.at, self._last_end)
        self._last_end = now
        if step.spilled:
            self._not_before = now + took * (1 - self.share) / self.share
