#!/usr/bin/env python3
"""Issue #54: a fairness.py record read against a steadier yardstick, on this machine (no
GPU). Per chat of each scenario's share arm: its median over the runs beside the long
request against (a) its median over the runs alone, fairness.py's own ratio, and (b) its
worst run alone (the yardstick's top: a chat's p99 alone moved 3.8-9.0x run to run in
fair12). Prints the chats within both goals (mean time per token <= 1.5x, p99 gap <= 3x)
each way and the worst p99 ratio against the worst run alone.
  against_worst_alone.py fairness.json[.xz] [ARM]"""

from __future__ import annotations

import json
import lzma
import statistics
import sys
from pathlib import Path
from typing import Any


def read(path: Path) -> dict[str, Any]:
    raw = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return dict(json.loads(raw))


def runs(arm: dict[str, Any]) -> tuple[list[list[dict[str, Any]]], list[list[dict[str, Any]]]]:
    alones = [arm["alone"], *arm["repeats"]["alone"]]
    besides = [arm["beside"]["chats"], *(b["chats"] for b in arm["repeats"]["beside"])]
    return alones, besides


def main() -> None:
    record = read(Path(sys.argv[1]))
    name = sys.argv[2] if len(sys.argv) > 2 else "share-0.1"
    for scenario, arms in record["scenarios"].items():
        alones, besides = runs(arms[name])
        against_median = against_worst = 0
        worst = 0.0
        chats = 0
        per_chat = zip(zip(*alones, strict=True), zip(*besides, strict=True), strict=True)
        for alone, beside in per_chat:
            if not all("p99_gap_s" in c for c in (*alone, *beside)):
                continue  # a chat that failed in any run: fairness.py counts it apart
            chats += 1
            mean = statistics.median(c["mean_tpot_s"] for c in beside) / statistics.median(
                c["mean_tpot_s"] for c in alone
            )
            p99 = statistics.median(c["p99_gap_s"] for c in beside)
            to_median = p99 / statistics.median(c["p99_gap_s"] for c in alone)
            to_worst = p99 / max(c["p99_gap_s"] for c in alone)
            against_median += mean <= 1.5 and to_median <= 3
            against_worst += mean <= 1.5 and to_worst <= 3
            worst = max(worst, to_worst)
        print(
            f"{scenario}: {chats} chats; within both goals against the median run alone "
            f"{against_median}, against the worst run alone {against_worst} (worst p99 "
            f"ratio {worst:.2f}x)"
        )


if __name__ == "__main__":
    main()
