"""Chats beside a long request against the same chats alone (issue #54, fairness.py):
each chat's ratios and the goals, its medians over runs, the yardstick's own noise, and
the tails over a scenario's chats. Each chat is kit.stream's Answer as JSON (mean_tpot_s,
p99_gap_s, max_gap_s, ttft_s; none of them where it failed)."""

from __future__ import annotations

import statistics
from typing import Any


def chat_ratios(alone: list[dict[str, Any]], next_to: list[dict[str, Any]]) -> dict[str, Any]:
    """Per chat (the same arrival and prompt length; another prompt, as the alone run's is
    in the prefix cache), beside over alone; and the worst of them."""
    pairs = [
        (a, b)
        for a, b in zip(alone, next_to, strict=True)
        if "mean_tpot_s" in a and "mean_tpot_s" in b
    ]
    tpot = [b["mean_tpot_s"] / a["mean_tpot_s"] for a, b in pairs]
    p99 = [b["p99_gap_s"] / a["p99_gap_s"] for a, b in pairs]
    return {
        "mean_tpot_ratio": tpot,
        "p99_gap_ratio": p99,
        "worst_mean_tpot_ratio": max(tpot, default=None),
        "worst_p99_gap_ratio": max(p99, default=None),
        "chats_within_goals": sum(t <= 1.5 and p <= 3 for t, p in zip(tpot, p99, strict=True)),
        "chats": len(pairs),
        "chats_failed": sum("mean_tpot_s" not in b for b in next_to),  # none counted above
    }


def alone_spread(runs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The yardstick's own noise: per chat, its worst run alone over its best (mean time
    per token, p99 gap), and the chats that would be over a goal against themselves."""
    tpot: list[float] = []
    p99: list[float] = []
    for chat in zip(*runs, strict=True):
        done = [c for c in chat if "mean_tpot_s" in c]
        if len(done) > 1:
            for key, spread in (("mean_tpot_s", tpot), ("p99_gap_s", p99)):
                spread.append(max(c[key] for c in done) / min(c[key] for c in done))
    return {
        "mean_tpot_spread": tpot,
        "p99_gap_spread": p99,
        "worst_mean_tpot_spread": max(tpot, default=None),
        "worst_p99_gap_spread": max(p99, default=None),
        "chats_over_goals": sum(t > 1.5 or p > 3 for t, p in zip(tpot, p99, strict=True)),
        "chats": len(tpot),
    }


def per_chat_median(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per chat, over runs of the same arrivals: the median of its mean time per token and
    of its p99 gap (a chat's p99 alone is ~8 or ~17-30 ms by where the others' prompts fall
    in its stream, which differs run to run: fair11); nothing for a chat that failed in
    any run (chat_ratios counts it failed). An odd number of runs: a true median."""
    merged = []
    for chat in zip(*runs, strict=True):
        done = [c for c in chat if "mean_tpot_s" in c]
        merged.append(
            {k: statistics.median(c[k] for c in done) for k in ("mean_tpot_s", "p99_gap_s")}
            if len(done) == len(chat)
            else {}
        )
    return merged


def tails_summary(chats: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the chats: mean of their mean time per token, the worst p99 and worst gap, TTFTs."""
    done = [c for c in chats if "mean_tpot_s" in c]
    if not done:
        return {}
    return {
        "mean_of_mean_tpot_s": statistics.fmean(c["mean_tpot_s"] for c in done),
        "worst_mean_tpot_s": max(c["mean_tpot_s"] for c in done),
        "worst_p99_gap_s": max(c["p99_gap_s"] for c in done),
        "worst_gap_s": max(c["max_gap_s"] for c in done),
        "ttft_median_s": statistics.median(c["ttft_s"] for c in done),
        "ttft_max_s": max(c["ttft_s"] for c in done),
    }
