#!/usr/bin/env python3
"""Issue #54's misses, read: each chat's long gaps beside the long request (in vLLM's
clock, CLOCK_MONOTONIC: ``began_s`` + its token times) next to the share server's step
log (``STEPLOG`` lines that s13/step_log.py and s14/step_log_arrivals.py, appended on the
GPU host, write: each request's arrival at the scheduler, each step's scheduling, launch
and end), over the window the chats ran in. Run on a fairness result folder (its
``fairness.json`` or ``.json.xz`` and ``logs-*.tar.xz``):

    gaps.py DIR SCENARIO[,SCENARIO...] [--arm share-0.1] [--over-ms 16]
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import tarfile
from pathlib import Path
from typing import Any

STEP = re.compile(r"STEPLOG (\w+) (\S+) at ([\d.]+)(.*)")


def load(folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    plain = folder / "fairness.json"
    if plain.exists():
        data = json.loads(plain.read_text())
    else:
        with lzma.open(f"{plain}.xz") as packed:
            data = json.loads(packed.read())
    logs = {}
    with tarfile.open(next(folder.glob("logs-*.tar.xz"))) as tar:
        for member in tar.getmembers():
            if (f := tar.extractfile(member)) is not None:
                logs[member.name] = f.read().decode(errors="replace")
    return data, logs


def steps(log: str) -> list[tuple[float, str, str, str]]:
    found = [
        (float(m[3]), m[1], m[2][:10], m[4][:140])
        for line in log.splitlines()
        if (m := STEP.search(line))
    ]
    return sorted(found)


def show(arm: dict[str, Any], events: list[tuple[float, str, str, str]], over: float) -> None:
    chats, long = arm["beside"]["chats"], arm["beside"].get("long", {})
    print("long request began", long.get("began_s"), "ttft", long.get("ttft_s"))
    for i, (chat, alone) in enumerate(zip(chats, arm["alone"], strict=True)):
        t = [chat["began_s"] + x for x in chat["times_s"]]
        big = [
            (round(t[j - 1], 4), round(1000 * (t[j] - t[j - 1]), 1))
            for j in range(1, len(t))
            if t[j] - t[j - 1] > over / 1000
        ]
        ratio = chat["p99_gap_s"] / alone["p99_gap_s"]
        print(
            f"chat {i:2d} began {chat['began_s']:.3f} p99 {1000 * chat['p99_gap_s']:.1f} ms "
            f"alone {1000 * alone['p99_gap_s']:.1f} ({ratio:.2f}x); gaps over {over:g} ms:",
            big[:8],
        )
    low = min(c["began_s"] for c in chats) - 0.5
    high = max(c["began_s"] + c["times_s"][-1] for c in chats if c["times_s"])
    print(f"-- the engine's steps from {low:.3f} to {high:.3f}")
    last_end = None
    for at, kind, key, rest in events:
        if not low <= at <= high:
            continue
        if kind == "end":  # only the ends that came long after the one before
            gap = 1000 * (at - last_end) if last_end else 0.0
            last_end = at
            if gap >= over:
                print(f"  {at:.4f} end {key} (+{gap:.1f} ms)")
        elif not (kind == "sched" and "long {}" in rest and "of 0 reqs" not in rest):
            print(f"  {at:.4f} {kind} {key} {rest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("scenarios")
    parser.add_argument("--arm", default="share-0.1")
    parser.add_argument("--over-ms", type=float, default=16.0)
    args = parser.parse_args()
    data, logs = load(args.folder)
    events = steps(logs.get(f"{args.arm}.log", ""))
    for name in args.scenarios.split(","):
        print(f"===== {name} ({args.arm})")
        show(data["scenarios"][name][args.arm], events, args.over_ms)


if __name__ == "__main__":
    main()
