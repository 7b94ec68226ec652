#!/usr/bin/env python3
"""Issue #54's share against spill_share's own rules on a simulated clock, before the GPU
measures it: one long request decoding with its KV in host RAM (each step that includes it
~0.14 s, its host reads), chats of 128 tokens arriving as fairness.py's scenarios send
them, and vLLM's engine with async scheduling (0.33's default on CUDA) modelled as
tests/vllm_patches/test_fair_scheduler.py's BatchQueue does: a step is scheduled while the
one before it runs, starts on the GPU when that one ends, and its output is handed over
when it ends; at the long request's first token its first decode step is already in
flight (scheduled as its last chunk ran), so chats that come then meet it running alone.
Per scenario: the share the scheduler would log as the long request ends
(what fairness.py reads), how many chats saw how many long gaps (a step with the spilled
request: one is within the p99 goal, a second may not be) and the worst chat's mean time
per token over its own alone.

A model, not a measurement, checked against the GPU (fair14 on an H100: all six rows,
two rules, inside its range or at its edge): step lengths are fair13's. Not
modelled: the long request's prefill (the scenarios start at its first token), chats
waiting for GPU blocks, a step's end seen late (the tests' ``seen_late``), more than one
long request. ``--rules FILE`` takes spill_share.py from another tree (an earlier commit's
rules, e.g. ``git show cb336f2:vllm_offload/vllm_ext/spill_share.py > FILE``, to set the
model against what the GPU measured with them).

    PYTHONPATH=. .venv/bin/python benchmarks/share_sim.py [--rules FILE] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import random
import re
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from benchmarks.gpu import fairness
from vllm_offload.vllm_ext import spill_share

# fair13 on an H100 (docs/benchmarks.md): a chat's decode step alone ~6.5 ms, a step with
# the spilled request 0.14 s alone and ~5 ms more beside chats (the worst gap), a step that
# prefills chats' 256-token prompts taken as 30 ms. fair15's H100 read host RAM slower: its
# spilled step took 0.215 s alone (--long-steps-ms).
CHAT_STEP_S, PREFILL_STEP_S = 0.0065, 0.030
LONG_STEP_S, LONG_BESIDE_EXTRA_S = 0.140, 0.005
CHAT_TOKENS = 128


@dataclass
class Chat:
    arrive: float
    unscheduled: int = CHAT_TOKENS  # tokens not yet in a scheduled step
    prefilled: bool = False
    token_at: list[float] = field(default_factory=list)  # when each token's step ended


@dataclass
class Run:
    chats: list[Chat]
    share: float | None  # as logged when the long request ends (None: no long request)
    long_tokens: int


def simulate(
    rules: ModuleType,
    share: float,
    starts: list[float],
    long_out: int,
    chat_step_s: float = CHAT_STEP_S,
    long_step_s: float = LONG_STEP_S,
    with_long: bool = True,
) -> Run:
    """One run: chats arriving at ``starts`` (s from the long request's first token), each
    of their decode steps ``chat_step_s`` without the long request, a step with it
    ``long_step_s`` alone."""
    now = [0.0]
    rule = rules.SpillShare(share=share, clock=lambda: now[0])
    chats = [Chat(arrive=t) for t in sorted(starts)]
    pending = deque(chats)
    active: list[Chat] = []
    queue: deque[tuple[object, list[Chat], float]] = deque()
    gpu_free, long_left, logged = 0.0, long_out if with_long else 0, None
    if with_long:  # its first decode step, scheduled as its last chunk ran (async)
        key, gpu_free, long_left = object(), long_step_s, long_left - 1
        rule.admit(others=False)
        rule.started(key, spilled=True, long_tokens=1)
        queue.append((key, [], gpu_free))
    while pending or active:  # once the chats are done, the share grows no more
        while pending and pending[0].arrive <= now[0]:
            active.append(pending.popleft())
        batch = [c for c in active if c.unscheduled > 0]
        present = long_left > 0
        if len(queue) < 2 and (batch or present):
            # fair_scheduler's: running or waiting, one whose last token is in flight too
            others = bool(active)
            takes_long = present and rule.admit(others=others)
            if batch or takes_long:
                took = long_step_s + (LONG_BESIDE_EXTRA_S if batch else 0.0) if takes_long else 0.0
                prefill = any(not c.prefilled for c in batch)
                took = max(took, PREFILL_STEP_S if prefill else chat_step_s if batch else 0.0)
                gpu_free = max(now[0], gpu_free) + took
                key = object()
                rule.started(
                    key,
                    spilled=takes_long,
                    shared=others and present,
                    beside=others,
                    long_tokens=1 if takes_long else 0,
                )
                for chat in batch:
                    chat.unscheduled -= 1
                    chat.prefilled = True
                long_left -= 1 if takes_long else 0
                queue.append((key, batch, gpu_free))
                continue
        if queue:
            key, ran, ends = queue.popleft()
            now[0] = max(now[0], ends)
            rule.ended(key)
            for chat in ran:
                chat.token_at.append(ends)
            active = [c for c in active if len(c.token_at) < CHAT_TOKENS]
            if with_long and long_left == 0 and logged is None and not queue:
                logged = rule.spilled_shared_s / rule.shared_s if rule.shared_s else 0.0
        elif pending:
            now[0] = max(now[0], pending[0].arrive)
    if with_long and logged is None:
        logged = rule.spilled_shared_s / rule.shared_s if rule.shared_s else 0.0
    return Run(chats=chats, share=logged, long_tokens=long_out - long_left)


def long_gaps(chat: Chat, long_step_s: float) -> int:
    """The gaps between its tokens as long as a step with the spilled request."""
    times = chat.token_at
    return sum(1 for a, b in itertools.pairwise(times) if b - a >= long_step_s)


def mean_time_per_token(chat: Chat) -> float:
    return (chat.token_at[-1] - chat.token_at[0]) / (len(chat.token_at) - 1)


def scenario(name: str, rng: random.Random) -> list[float]:
    """fairness.py's own arrivals of ``name`` (wave16, wave32, waves, wavesN, steady),
    which count from the long request's first token; ``steadyS``: its ``steady`` with
    ``--steady-s S`` (4 chats a second)."""
    steady_s = re.fullmatch(r"steady([1-9]\d*)", name)
    shape = argparse.Namespace(rate=4.0, steady_s=float(steady_s[1]) if steady_s else 15.0)
    starts, anchor = fairness.arrivals("steady" if steady_s else name, shape, rng)
    if anchor != "first token":  # its prefill beside the chats is not modelled
        raise SystemExit(f"{name}: only scenarios from the long request's first token")
    return starts


def measure(
    rules: ModuleType,
    share: float,
    name: str,
    long_out: int,
    seed: int,
    chat_step_s: float,
    long_step_s: float = LONG_STEP_S,
) -> dict[str, Any]:
    starts = scenario(name, random.Random(seed))
    beside = simulate(rules, share, starts, long_out, chat_step_s, long_step_s)
    alone = simulate(rules, share, starts, long_out, chat_step_s, long_step_s, with_long=False)
    seen = [long_gaps(c, long_step_s) for c in beside.chats]
    means = [
        mean_time_per_token(near) / mean_time_per_token(far)
        for near, far in zip(beside.chats, alone.chats, strict=True)
    ]
    return {
        "scenario": name,
        "share_set": share,
        "share_logged": round(beside.share or 0.0, 3),
        "long_tokens": beside.long_tokens,
        "chats": len(seen),
        "chats_by_long_gaps": {n: seen.count(n) for n in sorted(set(seen))},
        "worst_mean_ratio": round(max(means), 2),
    }


def load_rules(path: str | None) -> ModuleType:
    if path is None:
        return spill_share
    spec = importlib.util.spec_from_file_location("spill_share_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--rules {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules", help="spill_share.py of another tree (default: this one's)")
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument(
        "--scenarios", default="wave16,wave32,waves,waves8,waves12,waves24,steady,steady30,steady60"
    )
    parser.add_argument(
        "--long-out", type=int, default=48, help="fair13's; 0: as long as the chats last"
    )
    parser.add_argument(
        "--seeds", default="54,1,2,3,4", help="steady's arrivals (fairness.py's: 54)"
    )
    parser.add_argument(
        "--chat-steps-ms", default="6.5", help="chats' decode step without it, each in turn"
    )
    parser.add_argument(
        "--long-steps-ms",
        default="140",
        help="a step with the spilled request alone, each in turn (fair13/14's H100: 140, "
        "fair15's: 215)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rules = load_rules(args.rules)
    rows = []
    steps = itertools.product(
        [float(ms) for ms in args.long_steps_ms.split(",")],
        [float(ms) for ms in args.chat_steps_ms.split(",")],
    )
    for long_ms, chat_ms in steps:
        for name in args.scenarios.split(","):
            seeds = [int(n) for n in args.seeds.split(",")] if name.startswith("steady") else [0]
            for seed in seeds:
                long_out = args.long_out or 100_000
                row = measure(
                    rules, args.share, name, long_out, seed, chat_ms / 1000, long_ms / 1000
                )
                rows.append(row | {"seed": seed, "chat_step_ms": chat_ms, "long_step_ms": long_ms})
                print(
                    f"{name:9} long step {long_ms} ms, chat step {chat_ms} ms, seed {seed}: share "
                    f"{row['share_logged']:.3f} (set {args.share}), long tokens "
                    f"{row['long_tokens']}, chats by long gaps seen "
                    f"{row['chats_by_long_gaps']}, worst mean {row['worst_mean_ratio']}x"
                )
    if args.out:
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
