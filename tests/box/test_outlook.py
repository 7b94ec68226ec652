"""What `ps` and /v1/models say about each model (issue #43): since when it is on the GPU,
when its turn ends, and the expected wait of a request for a model away, worked out on
the fake clock from the switcher's rules and the last switch steps' lengths."""

from __future__ import annotations

import asyncio
import time

from tests.box.test_residency import FakeClock, TimedStandIn, run
from vllm_offload.box.outlook import outlook
from vllm_offload.box.residency import Residency, ResidencySettings


def test_the_turn_and_the_expected_wait() -> None:
    async def test() -> None:
        clock = FakeClock()
        log: list[str] = []
        engines = {n: TimedStandIn(n, log, clock) for n in "ab"}
        residency = Residency(
            engines, ResidencySettings(min_resident_s=5.0), clock=clock, sleep=clock.sleep
        )
        residency.start()

        async def ask(model: str) -> None:
            async with residency.lease(model):
                await clock.sleep(0.3)

        first = asyncio.create_task(ask("a"))  # a comes in (0.51 s) and is used
        await clock.run_until(1.0)
        await first
        rows = outlook(residency)
        assert rows["a"]["expected_wait_s"] == 0.0
        assert rows["b"]["expected_wait_s"] is None  # no put-away seen yet: unknown
        second = asyncio.create_task(ask("b"))  # waits for a's turn: until 0.51 + 5
        await clock.run_until(7.0)
        await second
        assert log == ["in a", "out a", "in b"]
        rows = outlook(residency)
        # b came in at 5.51 + 0.44 + 0.51 = 6.46 and was used: its turn ends 5 s later
        assert rows["b"]["turn_ends"] is not None and rows["b"]["since"] is not None
        assert abs(rows["b"]["turn_ends"] - rows["b"]["since"] - 5.0) < 1e-3
        assert abs(rows["b"]["since"] - (time.time() - (7.0 - 6.46))) < 1.0
        # a request for a now: b's turn left (11.46 - 7) and a switch (0.44 + 0.51)
        assert rows["a"]["expected_wait_s"] == round(11.46 - 7.0 + 0.44 + 0.51, 1)
        assert rows["a"]["since"] is None and rows["a"]["turn_ends"] is None
        await residency.stop()

    run(test)
