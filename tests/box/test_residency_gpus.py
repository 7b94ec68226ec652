"""The switcher on a box with several GPUs (issue #59): a switch puts away only models on
the GPUs the incoming one needs; models on other GPUs serve on, and one asked for there
does not wait behind a switch it has no part in. Stand-in engines; no timing assertion."""

from __future__ import annotations

import asyncio

from testkit.residency_clock import FakeClock, TimedStandIn
from tests.box.test_residency import Held, StandIn, run, until
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Event, ResidencySettings


def box(
    gpus: dict[str, tuple[int, ...]], min_resident_s: float = 0.0
) -> tuple[Residency, list[str], list[Event]]:
    log: list[str] = []
    events: list[Event] = []
    engines = {name: StandIn(name, log) for name in gpus}
    settings = ResidencySettings(min_resident_s=min_resident_s)
    return Residency(engines, settings, on_event=events.append, gpus=gpus), log, events


def test_models_on_two_gpus_serve_at_once_and_the_third_switches_with_its_neighbour() -> None:
    async def test() -> None:
        residency, log, _ = box({"a": (0,), "b": (1,), "c": (0,)})
        await residency.bring_in("a")
        await residency.bring_in("b")
        residency.start()
        assert log == ["in a", "in b"]  # side by side: nothing put away
        on_b = Held(residency, "b")
        await until(on_b.entered.is_set, "b's request")
        async with residency.lease("a"):  # both serve: no switch
            pass
        async with residency.lease("c"):  # 'c' shares GPU 0 with 'a' alone
            assert log == ["in a", "in b", "out a", "in c"]
        assert residency.slots["b"].status == "serving" and not on_b.task.done()
        on_b.release.set()
        await on_b.task
        await residency.stop()

    run(test)


def test_a_model_split_over_both_gpus_puts_away_a_model_on_each() -> None:
    async def test() -> None:
        residency, log, _ = box({"a": (0,), "b": (1,), "big": (0, 1)})
        await residency.bring_in("a")
        await residency.bring_in("b")
        residency.start()
        async with residency.lease("big"):
            assert sorted(log[2:4]) == ["out a", "out b"] and log[4:] == ["in big"]
        async with residency.lease("b"):  # GPU 1 full with 'big': it goes, 'a' stays away
            assert log[-2:] == ["out big", "in b"]
        assert residency.slots["a"].status == "away"
        await residency.stop()

    run(test)


def test_a_model_asked_for_on_another_gpu_does_not_wait_behind_a_turn() -> None:
    """'c' waits for GPU 0, where 'a' keeps its turn (an hour); 'd', asked for later on GPU
    1, comes in meanwhile (one GPU's switcher made it wait behind 'c')."""

    async def test() -> None:
        residency, log, _ = box({"a": (0,), "c": (0,), "d": (1,)}, min_resident_s=3600)
        await residency.bring_in("a")
        residency.start()
        on_a = Held(residency, "a")  # used in its turn: it stays the hour
        await until(on_a.entered.is_set, "a's request")
        for_c = Held(residency, "c")
        await until(lambda: bool(residency.slots["c"].queue), "c's request to wait")
        async with residency.lease("d"):
            assert log == ["in a", "in d"]
        assert not for_c.entered.is_set() and residency.slots["a"].status == "serving"
        on_a.release.set()
        for_c.task.cancel()
        await residency.stop()

    run(test)


def test_a_split_model_is_not_passed_over_by_models_taking_turns_on_its_gpus() -> None:
    """Review of #59: 'big' on GPUs 0 and 1, two people on each GPU's two models asking
    and reading all the while (turns of 2 s); someone asks for 'big' at 5 s. A model asked
    for later on one of its GPUs no longer jumps ahead of it (it was never brought in, 138
    switches in 10 s), and while it waits the switcher does not poll (a wait counted from a
    turn already over made it step every 10 ms)."""

    async def test() -> None:
        clock = FakeClock()
        gpus = {"big": (0, 1), "x": (0,), "x2": (0,), "y": (1,), "y2": (1,)}
        log: list[str] = []
        engines = {n: TimedStandIn(n, log, clock) for n in gpus}
        settings = ResidencySettings(min_resident_s=2.0)
        residency = Residency(engines, settings, clock=clock, sleep=clock.sleep, gpus=gpus)
        steps = 0
        step = residency._step

        async def counted() -> float | None:
            nonlocal steps
            steps += 1
            return await step()

        residency._step = counted  # type: ignore[method-assign]
        residency.start()
        waited: dict[str, float] = {}

        async def person(model: str) -> None:
            while clock() < 40.0:
                async with residency.lease(model):
                    await clock.sleep(0.3)
                await clock.sleep(1.0)

        async def once(model: str, at: float) -> None:
            await clock.sleep(at)
            asked = clock()
            async with residency.lease(model):
                waited[model] = clock() - asked

        tasks = [asyncio.create_task(person(m)) for m in ("x", "x2", "y", "y2")]
        tasks.append(asyncio.create_task(once("big", 5.0)))
        await clock.run_until(50.0)
        await asyncio.gather(*tasks)
        # a turn on each GPU, the put-aways there and its own bring-in, and one more round
        assert "in big" in log and waited["big"] <= 2 * (2.0 + 3 * 0.95), waited
        assert steps < 1000, steps
        await residency.stop()

    run(test)
