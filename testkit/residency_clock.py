"""Simulated time for the switcher (``box.residency`` takes its clock and sleep
injected): a clock the caller advances, and a stand-in engine whose moves take a switch's
measured time on it. The switcher's tests and benchmarks/fleet_turns_sim.py share them."""

from __future__ import annotations

import asyncio
import heapq


class FakeClock:
    """Simulated time: ``sleep`` waits until the test advances the clock past it, and
    ``run_until`` jumps from one wake-up to the next once every task has settled (the
    switcher's own waits included, which it makes through this clock)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, id(future), future))
        await future

    async def run_until(self, end: float) -> None:
        while True:
            for _ in range(200):  # every task runs until it waits on this clock
                await asyncio.sleep(0)
            while self._sleepers and self._sleepers[0][2].done():  # cancelled waits
                heapq.heappop(self._sleepers)
            if not self._sleepers or self._sleepers[0][0] > end:
                self.now = end
                return
            due, _, future = heapq.heappop(self._sleepers)
            self.now = max(self.now, due)
            future.set_result(None)


class TimedStandIn:
    """An engine whose moves take their measured time on the fake clock."""

    def __init__(self, name: str, log: list[str], clock: FakeClock) -> None:
        self.name, self.log, self.clock = name, log, clock

    async def bring_in(self) -> str:
        await self.clock.sleep(0.51)
        self.log.append(f"in {self.name}")
        return "woke"

    async def put_away(self) -> str:
        await self.clock.sleep(0.44)
        self.log.append(f"out {self.name}")
        return "slept"
