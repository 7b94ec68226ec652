"""Which models are on the GPU, and the switches between them.

A request leases its model: it runs at once when the model is resident and taking
requests, else it waits in that model's queue while a switch brings the model in. One
task makes the switches, one at a time, for the model whose request has waited longest:
it picks a resident model to put away (the least recently used of those that may go, on
the GPU the asked-for model needs: ``residency_gpus``; models on other GPUs serve on),
lets that model's requests in flight finish (new ones for it wait), puts it away (sleep or
stop), then brings the asked-for model in (wake or start) and lets its queue run.

Against thrashing (two people on two models, each asking, reading, asking again): a model
brought in gets a turn of ``min_resident_s``. While its turn lasts it stays, in use or
between its users' requests; once the turn is over and another model's requests wait, it
goes (its requests in flight finish first). So busy models take turns: at most one switch
per ``min_resident_s``, the requests that queued during a turn run together in the next,
and a request waits at most about one turn and two switches. A model nothing was asked of
since it came in (brought in by hand, or at start-up) may go at once. A queue over
``queue_limit`` requests answers Busy (a 503 with Retry-After); a model that fails to come
in fails its queue with the reason. (Before issue #43 a model with nothing in flight for
1 s could go at once: users with a second's think time switched on every request.)

Engines are injected (``EngineOps``): real vLLM processes in ``engines.py``, stand-ins in
the tests. Everything runs on one asyncio loop, so the bookkeeping needs no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from vllm_offload.box import residency_gpus, residency_turns
from vllm_offload.box.residency_records import (
    Books,
    Busy,
    EngineOps,
    Event,
    ResidencySettings,
    Slot,
    Step,
    Unavailable,
)
from vllm_offload.box.residency_turns import Switch

Sleep = Callable[[float], Awaitable[None]]


class Residency:
    def __init__(
        self,
        engines: Mapping[str, EngineOps],
        settings: ResidencySettings,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[Event], None] = lambda _event: None,
        sleep: Sleep = asyncio.sleep,  # the clock's: a fake clock's test drives both
        gpus: Mapping[str, tuple[int, ...]] | None = None,  # by model; None: all on one
    ) -> None:
        self.engines = engines
        self.settings = settings
        self.clock = clock
        self.sleep = sleep
        self.on_event = on_event
        placed = gpus or {}
        self.slots = {name: Slot(name=name, gpus=placed.get(name) or (0,)) for name in engines}
        self._kick = asyncio.Event()
        self._switching = asyncio.Lock()  # one switch step at a time, by hand or not
        self._task: asyncio.Task[None] | None = None

    # -- requests ---------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[None]:
        """Hold ``name`` resident for one request: waits while it is brought in; raises
        Busy (queue full) or Unavailable (it could not come in)."""
        slot = self.slots[name]
        if slot.status == "serving":
            slot.in_flight += 1
        else:
            await self._wait_for(slot)  # returns holding a place the switch reserved
        slot.last_used, slot.used = self.clock(), True
        try:
            yield
        finally:
            self._done_with(slot)

    def _done_with(self, slot: Slot) -> None:
        slot.in_flight -= 1
        slot.last_used = self.clock()
        if slot.in_flight == 0:
            slot.drained.set()
        self._kick.set()

    async def _wait_for(self, slot: Slot) -> None:
        waiting = sum(len(s.queue) for s in self.slots.values())
        if waiting >= self.settings.queue_limit:
            raise Busy(
                f"{waiting} requests already wait for a model switch (residency.queue_limit); "
                "try again shortly",
                retry_after_s=max(1, round(self.settings.min_resident_s)),
            )
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.clock(), future)
        slot.queue.append(entry)
        self._kick.set()
        try:
            await future
        except asyncio.CancelledError:  # the client went away
            if future.done() and not future.cancelled() and future.exception() is None:
                self._done_with(slot)  # the place reserved for it
            raise
        finally:
            if entry in slot.queue:
                slot.queue.remove(entry)

    def state(self) -> dict[str, Books]:
        now = self.clock()
        return {
            name: Books(
                status=s.status,
                in_flight=s.in_flight,
                waiting=len(s.queue),
                step=s.step,
                step_elapsed_s=None if s.step is None else round(now - s.step_began, 1),
                bring_in_s=_rounded(s.bring_in_s),
                put_away_s=_rounded(s.put_away_s),
            )
            for name, s in self.slots.items()
        }

    # -- the switcher -----------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="switcher")

    async def stop(self) -> None:
        """No more switches; the requests waiting for one fail (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for slot in self.slots.values():
            self._release(slot, Unavailable("the server is stopping"))

    async def bring_in(self, name: str) -> None:
        """Make ``name`` resident now (start-up, or by hand), putting another away first
        if the GPU is full; raises Unavailable if it cannot come in."""
        slot = self.slots[name]
        async with self._switching:
            if slot.status in ("serving", "draining"):
                return
            self._begin(slot, "bring-in")
            resident, cap = self._resident(), self.cap(slot)
            for victim in residency_gpus.victims(slot, resident, cap, lambda _s: True) or ():
                await self._put_away(victim)
            await self._bring_in(slot)
        if slot.status != "serving":
            raise Unavailable(f"model '{name}' could not be brought in (see the events)")

    async def start_together(self, names: Sequence[str]) -> None:
        """Bring ``names`` in side by side, then put each away (start-up: the plan found
        their GPUs hold them all as they start, plan.box_start; a first sleep makes the
        host copy of the weights). One that fails to start is left failed."""
        async with self._switching:
            slots = [self.slots[name] for name in names]
            await asyncio.gather(*(self._bring_in(slot) for slot in slots))
            await asyncio.gather(*(self._put_away(s) for s in slots if s.status == "serving"))

    async def put_away(self, name: str) -> None:
        """Put ``name`` away now (by hand, or its keep_alive passed)."""
        slot = self.slots[name]
        async with self._switching:
            if slot.status in ("serving", "draining"):
                await self._put_away(slot)

    def engine_exited(self, name: str) -> None:
        """Its process ended on its own: the model is no longer anywhere."""
        slot = self.slots[name]
        if slot.status != "moving":  # a switch step in progress learns it from its call
            slot.status = "failed"
            self._event(name, f"the engine of '{name}' exited; it starts again when asked for")
        self._kick.set()

    def _resident(self) -> list[Slot]:
        return residency_turns.resident(self.slots.values())

    def cap(self, slot: Slot) -> int:
        """Models on one of ``slot``'s GPUs at once."""
        return residency_turns.cap(self.settings, slot)

    def full(self, slot: Slot) -> list[int]:
        return residency_gpus.full(slot, self._resident(), self.cap(slot))

    def in_the_way(self, slot: Slot) -> list[Slot]:
        return residency_gpus.in_the_way(slot, self._resident(), self.cap(slot))

    async def _run(self) -> None:
        while True:
            self._kick.clear()  # before the step: a kick during it is seen after it
            async with self._switching:
                wait_s = await self._step()
            if wait_s is not None and wait_s <= 0:
                continue
            await self._kicked_or(wait_s)

    async def _kicked_or(self, wait_s: float | None) -> None:
        """Until a kick, or ``wait_s`` on the injected clock (None: a kick only)."""
        waits: set[asyncio.Future[object]] = {asyncio.ensure_future(self._kick.wait())}
        if wait_s is not None:
            waits.add(asyncio.ensure_future(self.sleep(wait_s)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _step(self) -> float | None:
        """Make the next switch, if one is due (``residency_turns.next_switch``); seconds
        until something may change by time alone (None: only a request or an exit changes
        anything)."""
        due = residency_turns.next_switch(list(self.slots.values()), self.settings, self.clock())
        if due is None:
            return await self._expire_idle()
        if not isinstance(due, Switch):
            return due
        self._begin(due.target, "bring-in")
        for victim in due.going:
            await self._put_away(victim)
        await self._bring_in(due.target)
        return 0

    async def _expire_idle(self) -> float | None:
        keep = self.settings.keep_alive_s
        if keep is None:
            return None
        now = self.clock()
        idle = [s for s in self._resident() if s.in_flight == 0 and now - s.last_used >= keep]
        for slot in idle:
            await self._put_away(slot, why=f"idle for {keep:g} s (residency.keep_alive_s)")
        busy = [s.last_used + keep - now for s in self._resident()]
        return max(0.01, min(busy)) if busy else None

    def _begin(self, slot: Slot, step: Step) -> None:
        """Mark ``step`` under way for ``slot`` from now (a bring-in already marked, from
        the put-away that makes room for it, keeps its start)."""
        if slot.step != step:
            slot.step, slot.step_began = step, self.clock()

    async def _put_away(self, slot: Slot, why: str = "") -> None:
        self._begin(slot, "put-away")
        slot.status = "draining"
        if slot.in_flight:
            slot.drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(slot.drained.wait(), self.settings.drain_timeout_s)
        slot.status = "moving"
        began = self.clock()
        try:
            how = await self.engines[slot.name].put_away()
        except Exception as exc:  # a sleep that fails leaves the engine unusable
            slot.status, slot.step = "failed", None
            self._event(slot.name, f"putting '{slot.name}' away failed: {exc}")
            return
        slot.status, slot.step, slot.put_away_s = "away", None, self.clock() - began
        why = f": {why}" if why else ""
        self._event(slot.name, f"{how} '{slot.name}'{why}", slot.put_away_s, "put-away")

    async def _bring_in(self, slot: Slot) -> None:
        self._begin(slot, "bring-in")
        slot.status = "moving"
        began = self.clock()
        try:
            how = await self.engines[slot.name].bring_in()
        except Exception as exc:
            slot.status, slot.step = "failed", None
            self._event(slot.name, f"'{slot.name}' could not be brought in: {exc}")
            self._release(slot, Unavailable(f"model '{slot.name}' could not be brought in: {exc}"))
            return
        slot.status, slot.step, slot.used = "serving", None, bool(slot.queue)
        slot.since = slot.last_used = self.clock()
        slot.bring_in_s = slot.since - began
        self._event(slot.name, f"{how} '{slot.name}'", slot.bring_in_s, "bring-in")
        self._release(slot, None)

    def _release(self, slot: Slot, error: Exception | None) -> None:
        """Let the queue run (each request's place counted in flight now, before its task
        runs: the next switch step must not find the model idle), or fail it."""
        while slot.queue:
            _, future = slot.queue.popleft()
            if future.done():
                continue
            if error is None:
                slot.in_flight += 1
                future.set_result(None)
            else:
                future.set_exception(error)

    def _event(
        self, model: str, text: str, seconds: float | None = None, step: Step | None = None
    ) -> None:
        self.on_event(
            Event(
                t=round(time.time(), 3),
                text=text,
                model=model,
                step=step,
                seconds=_rounded(seconds),
            )
        )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
