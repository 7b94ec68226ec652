"""Which resident models stand in the way of one coming in (``box.residency``), on a box
whose models may run on different GPUs (plan.placement): a GPU is full when it holds as
many resident models as the model's group keeps at once; a model comes in when none of
its GPUs is full, else one model on each full GPU goes first (one on several of them
counts for each). On one GPU every model is on GPU 0: the rules of one GPU. Pure: the
slots and the clock's reading in, the answer out."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from vllm_offload.box.residency_records import Slot


def full(slot: Slot, resident: Sequence[Slot], cap: int) -> list[int]:
    """``slot``'s GPUs that hold ``cap`` resident models already."""
    return [g for g in slot.gpus if sum(g in s.gpus for s in resident) >= cap]


def in_the_way(slot: Slot, resident: Sequence[Slot], cap: int) -> list[Slot]:
    """Resident models on a full GPU of ``slot``'s."""
    crowded = set(full(slot, resident, cap))
    return [s for s in resident if crowded & set(s.gpus)]


def victims(
    slot: Slot, resident: Sequence[Slot], cap: int, may_go: Callable[[Slot], bool]
) -> list[Slot] | None:
    """The models to put away for ``slot`` (none: it has room): on each full GPU, one that
    may go, one on several full GPUs first (it frees them all), else the least recently
    used; None where a full GPU has none that may go."""
    crowded = set(full(slot, resident, cap))
    chosen: list[Slot] = []
    for gpu in sorted(crowded):
        on = [s for s in resident if gpu in s.gpus]
        if any(s in chosen for s in on):  # one put away already frees this GPU too
            continue
        ready = [s for s in on if s.status == "serving" and may_go(s)]
        if not ready:
            return None
        chosen.append(min(ready, key=lambda s: (-len(crowded & set(s.gpus)), s.last_used)))
    return chosen


def turn_wait(
    slot: Slot, resident: Sequence[Slot], cap: int, turn_end: Callable[[Slot], float], now: float
) -> float:
    """Seconds until every full GPU of ``slot``'s has a model whose turn is over: the
    latest, over those GPUs, of the earliest turn end on each (0: now)."""
    waits = [
        min(turn_end(s) for s in resident if gpu in s.gpus) - now
        for gpu in full(slot, resident, cap)
    ]
    return max(0.0, *waits)
