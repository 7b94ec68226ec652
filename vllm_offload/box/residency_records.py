"""The switcher's records (``box.residency``): its settings, the engine it drives, the errors
a request may meet, each model's place in its books (and as the control socket shows them),
and the events it reports."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypedDict

from vllm_offload.config.models import ResidencySection

Status = Literal["serving", "draining", "away", "moving", "failed"]
Step = Literal["bring-in", "put-away"]


class EngineOps(Protocol):
    """One model's engine, as the switcher drives it."""

    async def bring_in(self) -> str:
        """Wake it, or start it; returns how ("woke", "started"). Raises on failure."""
        ...

    async def put_away(self) -> str:
        """Sleep it, or stop it; returns how ("slept", "stopped")."""
        ...


class Busy(Exception):
    """Too many requests wait for switches; try again after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(Exception):
    """The model could not be brought in (its engine failed to start or wake)."""


_SECTION = ResidencySection.model_fields


@dataclass(frozen=True, kw_only=True)
class ResidencySettings:
    """The switcher's settings; their defaults are [residency]'s (one home: its schema).
    min_resident_s has none: [residency]'s is 'auto', which the plan resolves (by idle and
    sleep_level); a default here would be a second answer that could disagree."""

    max_resident: int = 1  # models on one GPU at once, as the plan resolved it
    # Models whose GPUs' group the plan resolved another count for (several GPUs, #59):
    # models on one of their GPUs at once; the rest have max_resident.
    resident_beside: Mapping[str, int] = field(default_factory=dict)
    min_resident_s: float  # a model's turn once used, as the plan resolved it
    keep_alive_s: float | None = None  # idle this long: put away; None ('forever'): until needed
    queue_limit: int = _SECTION["queue_limit"].default  # requests waiting, all models
    drain_timeout_s: float = _SECTION["drain_timeout_s"].default  # in flight, put away


@dataclass(kw_only=True)
class Slot:
    """One model's place in the switcher's books."""

    name: str
    gpus: tuple[int, ...] = (0,)  # the GPUs its engine holds while resident (plan.placement)
    status: Status = "away"
    in_flight: int = 0
    since: float = 0.0  # when it last became resident
    last_used: float = 0.0
    used: bool = False  # asked for since it became resident
    bring_in_s: float | None = None  # how long its last bring-in took
    put_away_s: float | None = None  # and its last put-away
    step: Step | None = None  # a switch step under way for it (a bring-in counts the
    step_began: float = 0.0  # put-away that makes room for it: a person waits on both)
    queue: deque[tuple[float, asyncio.Future[None]]] = field(default_factory=deque)
    drained: asyncio.Event = field(default_factory=asyncio.Event)


class Books(TypedDict):
    """One model's books, as the control socket shows them (the manager's page, ps)."""

    status: Status
    in_flight: int
    waiting: int  # requests queued for it
    step: Step | None  # a switch step under way for it
    step_elapsed_s: float | None  # for how long, on the switcher's clock
    bring_in_s: float | None  # its last bring-in took
    put_away_s: float | None  # its last put-away took


@dataclass(frozen=True, kw_only=True)
class Event:
    t: float  # wall clock
    text: str
    model: str
    step: Step | None = None  # the switch step it ends (None: a failure, a note)
    seconds: float | None = None  # how long the switch step took
