"""What `ps` and /v1/models say about each model (issue #43): since when it is on the GPU,
when its turn ends, and the expected wait of a request for a model away, worked out on
the fake clock from the switcher's rules and the last switch steps' lengths."""

from __future__ import annotations

import asyncio
import time

from testkit.residency_clock import FakeClock, TimedStandIn
from tests.box.test_residency import run
from vllm_offload.box.outlook import outlook
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import ResidencySettings


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


def test_a_switch_under_way_is_in_the_books() -> None:
    """What the manager's page shows while a switch is under way (issue #43): the model
    asked for is being brought in from the moment the resident one starts to go (a person
    waits on both steps), for how long so far, the requests waiting, and afterwards how
    long its steps took."""

    async def test() -> None:
        clock = FakeClock()
        engines = {n: TimedStandIn(n, [], clock) for n in "ab"}
        residency = Residency(
            engines, ResidencySettings(min_resident_s=0.0), clock=clock, sleep=clock.sleep
        )
        first = asyncio.create_task(residency.bring_in("a"))
        await clock.run_until(1.0)
        await first
        residency.start()
        books = residency.state()
        assert books["a"]["step"] is None and books["a"]["bring_in_s"] == 0.51
        assert books["b"]["step"] is None and books["b"]["step_elapsed_s"] is None

        async def ask() -> None:
            async with residency.lease("b"):
                pass

        waiting = [asyncio.create_task(ask()) for _ in range(2)]
        await clock.run_until(clock.now + 0.3)  # a's put-away (0.44 s) under way
        books = residency.state()
        assert (books["a"]["step"], books["a"]["step_elapsed_s"]) == ("put-away", 0.3)
        assert (books["b"]["step"], books["b"]["step_elapsed_s"]) == ("bring-in", 0.3)
        assert books["b"]["waiting"] == 2 and books["b"]["status"] == "away"
        await clock.run_until(clock.now + 0.5)  # a away at 0.44; b's bring-in (0.51) since
        books = residency.state()
        assert books["a"]["step"] is None and books["a"]["put_away_s"] == 0.44
        assert (books["b"]["step"], books["b"]["step_elapsed_s"]) == ("bring-in", 0.8)
        await clock.run_until(clock.now + 1.0)
        await asyncio.gather(*waiting)
        books = residency.state()
        assert books["b"]["step"] is None and books["b"]["step_elapsed_s"] is None
        assert books["b"]["status"] == "serving" and books["b"]["bring_in_s"] == 0.51
        assert books["b"]["waiting"] == 0
        await residency.stop()

    run(test)
