"""When each model came onto the GPU, how long it stays, and about how long a request for a
model that is away waits: what `vllm-offload ps`, the manager and ``/v1/models`` show.

From the switcher's books and its rules (residency.py): a resident model used in its turn
stays until the turn ends (``since + min_resident_s``), then until another model is asked
for (or ``keep_alive_s`` after its last use); one nothing was asked of may go at once. A
request for a model away waits for the turn of the resident model that goes first (when
its GPUs are full), that model's put-away, one more turn and switch for each model already
waiting ahead of it, and its own bring-in, each switch step as long as it last took (or
the longest such step of any model; unknown before the first: then None).
"""

from __future__ import annotations

import time
from functools import partial

from vllm_offload.box import residency_gpus
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Slot

Outlook = dict[str, float | None]


def turn_end(residency: Residency, slot: Slot) -> float:
    """On the switcher's clock: when a resident ``slot`` may go for another model."""
    return slot.since + residency.settings.min_resident_s if slot.used else slot.since


def outlook(residency: Residency) -> dict[str, Outlook]:
    """Per model: ``since``, ``turn_ends``, ``keep_alive_until`` (Unix times; None where it
    is not resident, or nothing but another model's request puts it away) and
    ``expected_wait_s`` (0 for a model serving; None where a step's length is unknown)."""
    now, wall = residency.clock(), time.time()
    keep = residency.settings.keep_alive_s
    resident = [s for s in residency.slots.values() if s.status in ("serving", "draining")]

    def unix(t: float | None) -> float | None:
        return None if t is None else round(wall - (now - t), 3)

    rows = {}
    for name, slot in residency.slots.items():
        on = slot in resident
        kept = slot.last_used + keep if on and keep is not None else None
        rows[name] = {
            "since": unix(slot.since) if on else None,
            "turn_ends": unix(turn_end(residency, slot)) if on else None,
            "keep_alive_until": unix(kept),
            "expected_wait_s": 0.0 if slot.status == "serving" else _wait(residency, slot, now),
        }
    return rows


def _asked(slot: Slot) -> float | None:
    """When its oldest waiting request came (None: none waits). The routes that read this
    may run in a worker thread while the loop changes the queue: one atomic read."""
    try:
        return slot.queue[0][0]
    except IndexError:
        return None


def _wait(residency: Residency, slot: Slot, now: float) -> float | None:
    in_the_way = residency.in_the_way(slot)
    mine = _asked(slot)
    mine = now if mine is None else mine
    asked = [  # models waiting for its GPUs (on others they switch apart)
        _asked(s)
        for s in residency.slots.values()
        if s is not slot and s.status in ("away", "failed") and set(s.gpus) & set(slot.gpus)
    ]
    ahead = sum(1 for t in asked if t is not None and t < mine)
    slots = residency.slots.values()
    steps = [_step(slot.bring_in_s, [s.bring_in_s for s in slots])]
    turn = 0.0
    if in_the_way:  # the turns on its full GPUs, and a put-away
        resident = [s for s in slots if s.status in ("serving", "draining")]
        ends = partial(turn_end, residency)
        turn = residency_gpus.turn_wait(slot, resident, residency.cap(slot), ends, now)
        first = min(in_the_way, key=ends)
        steps.append(_step(first.put_away_s, [s.put_away_s for s in slots]))
    if any(step is None for step in steps):
        return None
    switch = sum(step for step in steps if step is not None)
    return round(turn + switch + ahead * (residency.settings.min_resident_s + switch), 1)


def _step(own: float | None, anyones: list[float | None]) -> float | None:
    """A switch step's length: as it last took for this model, else the longest any model's
    took (the set's engines are alike enough to guess by), else unknown."""
    known = [t for t in anyones if t is not None]
    return own if own is not None else max(known, default=None)
