"""Several models' switches as the page shows them (issue #43), from the front door's
control socket (box.control's /models): each model's step under way and the steps that
ended, for the switches-over-time strip. Whoever runs as the server's user can answer on
that socket, so each value is taken only if it is of its kind."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import TypedDict, get_args

from vllm_offload.box.residency_records import Step

STEPS: tuple[Step, ...] = get_args(Step)


class Progress(TypedDict):
    """A model's switch as the page shows it: the step under way (a bring-in counts the
    put-away making room for it) and for how long, the requests waiting for it, its last
    steps' lengths and the expected wait of a request for it (None: unknown)."""

    step: Step | None
    elapsed_s: float | None
    waiting: int
    last_bring_in_s: float | None
    last_put_away_s: float | None
    expected_wait_s: float | None


class Switch(TypedDict):
    """One of the front door's events (residency.Event), each value of its kind: when
    (wall clock, s), what it says, of which model, the switch step it ends (None: a
    failure, a note) and how long that took."""

    t: float
    text: str
    model: str
    step: Step | None
    seconds: float | None


class Ended(TypedDict):
    """A switch step that ended: which model, which step, when it ended (wall clock, s)
    and how long it took."""

    model: str
    step: Step
    t: float
    seconds: float


def progress(row: object) -> Progress:
    """From the front door's row (control.create_control_app's /models)."""
    books = row if isinstance(row, dict) else {}
    step = books.get("step")
    waiting = books.get("waiting")
    return Progress(
        step=next((known for known in STEPS if step == known), None),
        elapsed_s=seconds(books.get("step_elapsed_s")),
        waiting=waiting if type(waiting) is int and 0 <= waiting < 1 << 31 else 0,
        last_bring_in_s=seconds(books.get("bring_in_s")),
        last_put_away_s=seconds(books.get("put_away_s")),
        expected_wait_s=seconds(books.get("expected_wait_s")),
    )


def switches(events: object) -> list[Switch]:
    """The front door's events (control.create_control_app's /models), in its order: each
    one with a model's name and a time, its other values kept only where of their kind."""
    found = []
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict):
            continue
        model, text, step = event.get("model"), event.get("text"), event.get("step")
        t = seconds(event.get("t"))
        if isinstance(model, str) and t is not None:
            found.append(
                Switch(
                    t=t,
                    text=text if isinstance(text, str) else "",
                    model=model,
                    # the page's own string, not the one read
                    step=next((known for known in STEPS if step == known), None),
                    seconds=seconds(event.get("seconds")),
                )
            )
    return found


def ended(found: list[Switch], models: Collection[str]) -> list[Ended]:
    """The switch steps that ended among the events, oldest first: only those of a model
    this config serves, with a step and a length."""
    steps = [
        Ended(model=s["model"], step=s["step"], t=s["t"], seconds=s["seconds"])
        for s in found
        if s["model"] in models and s["step"] is not None and s["seconds"] is not None
    ]
    return sorted(steps, key=lambda e: e["t"])


def seconds(value: object) -> float | None:
    """A finite, non-negative number of seconds, else None."""
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return value
    if type(value) is int and 0 <= value < 1 << 53:  # not a bool; a float holds it
        return float(value)
    return None
