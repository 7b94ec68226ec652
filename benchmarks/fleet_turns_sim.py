#!/usr/bin/env python3
"""Issue #43's load against the switcher's own code (box.residency) on a simulated clock:
two people, one per model, each asking (an answer of ANSWER_S) and reading for THINK_S,
for 60 s, with one model on the GPU at a time and each switch step as long as measured on
the H100 (put away 0.44 s, bring in 0.51 s: issue #43). For each min_resident_s: the
switches and each person's wait before their request runs (p50, p95, max). A model, not a
measurement: the GPU's own table (TTFT per model) is still to be measured.

    PYTHONPATH=. .venv/bin/python benchmarks/fleet_turns_sim.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

from testkit.residency_clock import FakeClock, TimedStandIn
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import ResidencySettings

ANSWER_S, THINK_S, RUN_S = 0.3, 1.0, 60.0
TURNS = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0)


async def simulate(min_resident_s: float) -> dict[str, Any]:
    clock = FakeClock()
    log: list[str] = []
    engines = {n: TimedStandIn(n, log, clock) for n in "ab"}
    residency = Residency(
        engines, ResidencySettings(min_resident_s=min_resident_s), clock=clock, sleep=clock.sleep
    )
    first = asyncio.create_task(residency.bring_in("a"))
    await clock.run_until(1.0)
    await first
    residency.start()
    waits: dict[str, list[float]] = {"a": [], "b": []}

    async def person(model: str) -> None:
        while clock() < 1.0 + RUN_S:
            asked = clock()
            async with residency.lease(model):
                waits[model].append(clock() - asked)
                await clock.sleep(ANSWER_S)
            await clock.sleep(THINK_S)

    people = [asyncio.create_task(person(m)) for m in "ab"]
    await clock.run_until(1.0 + RUN_S + 30.0)
    await asyncio.gather(*people)
    await residency.stop()
    row: dict[str, Any] = {
        "min_resident_s": min_resident_s,
        "switches": log.count("in a") + log.count("in b") - 1,
    }
    for model, seen in waits.items():
        seen.sort()
        row[model] = {
            "requests": len(seen),
            "waited_over_1s": sum(w > 1.0 for w in seen),
            "wait_p50_s": round(statistics.median(seen), 2),
            "wait_p95_s": round(seen[int(0.95 * (len(seen) - 1))], 2),
            "wait_mean_s": round(statistics.fmean(seen), 2),
            "wait_max_s": round(seen[-1], 2),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = [asyncio.run(simulate(turn)) for turn in TURNS]
    print("min_resident_s  switches  per model: requests, wait p50 / p95 / mean / max (s)")
    for row in rows:
        cells = [
            f"{m} {row[m]['requests']}, {row[m]['wait_p50_s']} / {row[m]['wait_p95_s']} / "
            f"{row[m]['wait_mean_s']} / {row[m]['wait_max_s']}"
            for m in "ab"
        ]
        print(f"{row['min_resident_s']:>14g}  {row['switches']:>8}  " + "; ".join(cells))
    if args.out:
        setup = {
            "answer_s": ANSWER_S,
            "think_s": THINK_S,
            "run_s": RUN_S,
            "put_away_s": 0.44,
            "bring_in_s": 0.51,
            "max_resident": 1,
        }
        args.out.write_text(json.dumps({"setup": setup, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
