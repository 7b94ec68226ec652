"""Which switch is due (``box.residency``): the model asked for longest comes in first,
putting away what stands in its way (``residency_gpus``) once their turns allow; while it
waits for turns to end, a model asked for later may come in only on GPUs it has no part
in, so that a model split over several GPUs is not passed over for ever by models that
take turns on each of them. Pure: the slots, the settings and the clock's reading in, the
answer out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_offload.box import residency_gpus
from vllm_offload.box.residency_records import ResidencySettings, Slot


@dataclass(frozen=True, kw_only=True)
class Switch:
    """A switch due now: ``going`` put away (in order), then ``target`` brought in."""

    target: Slot
    going: list[Slot]


def resident(slots: Iterable[Slot]) -> list[Slot]:
    """The models on a GPU: serving, or finishing their requests before they go."""
    return [s for s in slots if s.status in ("serving", "draining")]


def cap(settings: ResidencySettings, slot: Slot) -> int:
    """Models on one of ``slot``'s GPUs at once."""
    return settings.resident_beside.get(slot.name, settings.max_resident)


def may_go(settings: ResidencySettings, slot: Slot, now: float) -> bool:
    """Its turn is over, or it was never used in it."""
    over = now - slot.since >= settings.min_resident_s
    return over or (slot.in_flight == 0 and not slot.used)


def waiting(slots: Iterable[Slot]) -> list[Slot]:
    """The models not resident that requests wait for, longest waiting first."""
    asked = [s for s in slots if s.queue and s.status in ("away", "failed")]
    return sorted(asked, key=lambda s: s.queue[0][0])


def next_switch(
    slots: Sequence[Slot], settings: ResidencySettings, now: float
) -> Switch | float | None:
    """The switch due now; else seconds until a turn in the way ends; None: no request
    waits for a model."""
    targets = waiting(slots)
    if not targets:
        return None
    on_gpu = resident(slots)
    waits: list[float] = []
    waited_for: set[int] = set()  # the GPUs of the models that wait
    for target in targets:
        if waited_for & set(target.gpus):
            continue
        room = cap(settings, target)
        going = residency_gpus.victims(target, on_gpu, room, lambda s: may_go(settings, s, now))
        if going is not None:
            return Switch(target=target, going=going)
        ends = residency_gpus.turn_wait(  # until the turns on its full GPUs end
            target, on_gpu, room, lambda s: s.since + settings.min_resident_s, now
        )
        waits.append(max(0.01, ends))
        waited_for |= set(target.gpus)
    return min(waits)
