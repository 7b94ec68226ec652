#!/usr/bin/env python3
"""Issues #42 and #54 on the GPU host: chats beside one request spilled into the KV pool's
host extension, from every chat's first token. Llama-3.1-8B shape, dummy weights, CUDA
graphs, one server per arm through `vllm-offload serve`, both up at once:

  gpu-only   a GPU pool of --pool-gib, no extension (the chats' reference server)
  share-S    the same GPU pool + --extension-gib of host RAM, kv_offload.spilled_step_share
             S for each S in --shares (0.1: the default; 1: patch 0006 alone)
  share-S-capC  for each C in --caps: share-S with vLLM's --long-prefill-token-threshold
             C (a long prompt's chunk is at most C tokens while other requests run or
             wait; the whole --chunk-tokens alone)
  all-gpu    with --all-gpu-pool-gib: a GPU pool that holds the long request (no host
             reads), the long request beside the chats too: what vLLM's own scheduling
             of such a request costs them
  share-S-switchI  for each I in --switch-intervals: share-S with BENCH_SWITCH_INTERVAL_S=I
             in its environment (Python's switch interval in seconds, read only by a
             snippet a call script appends on the GPU host)
  share-S-base  with --base-tree DIR: share-S with vllm_offload imported from DIR (a
             copy of an earlier commit's tree): the rules before a change, in the same run

--arms keeps only the arms named (comma-separated; all by default).

Scenarios (--scenarios), each with one long request (--long-tokens random ids in,
--long-out out) and chats of --chat-in in / --chat-out out (greedy, ignore_eos):

  wave16, wave32  16 or 32 chats at once at the long request's first token
  before          16 chats, the long request 0.3 s after them (its prefill beside them)
  with            16 chats and the long request at once
  waves, wavesN   4 (or N) waves of 8 chats, one every 2 s from the long request's first
                  token (the long request's --long-out must last them: ~8 tokens a wave)
  steady          chats arriving at --rate a second (seeded Poisson) for --steady-s
  during          the same from the long request's sending: chats beside its prefill

Each scenario runs its chats on each arm --repeats times (default 1; odd: a true median),
alone (the same arrival times, no long request) and beside the long request in turn, fresh
prompts each time. Per chat, from its first token: mean time per token, p99 and worst gap
(kit.stream.tail), and the ratios of its medians over the runs to the same chat's alone
(chats failed counted apart); with repeats, each chat's spread alone (its worst run over
its best: the yardstick's noise); per scenario the long request's decode rate (first run)
and the median time share the scheduler measured (fair_scheduler's log line when a
spilled request ends). Goals (#54): each chat's mean time per token <= 1.5x and p99 gap
<= 3x alone; the share within +-20 % of the setting.
Writes OUT/fairness.json and each server's log.

    benchmarks/gpu/fairness.py --out DIR
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.arms import Arm, serving, tree_env
from kit.chat_ratios import alone_spread, chat_ratios, per_chat_median, tails_summary
from kit.model import GIB, VOCAB, split_line, write_model
from kit.record import Record
from kit.stream import Answer, stream

from vllm_offload.bench.server_process import ServerProcess

# "(at least L s)" since 346bda0's review: the share lies between L / T and S / T.
SHARE_LINE = re.compile(
    r"spilled steps took ([\d.]+) s (?:\(at least ([\d.]+) s\) )?of ([\d.]+) s of steps beside"
)


def arrivals(name: str, args: argparse.Namespace, rng: random.Random) -> tuple[list[float], str]:
    """The chats' start times (s) and what they count from: the long request's first
    token ('first token') or its sending ('sent')."""
    if name in ("wave16", "wave32"):
        return [0.0] * int(name[4:]), "first token"
    if name == "before":
        return [-0.3] * 16, "sent"
    if name == "with":
        return [0.0] * 16, "sent"
    if re.fullmatch(r"waves(?:[1-9]\d*)?", name):
        return [2.0 * w for w in range(int(name[5:] or 4)) for _ in range(8)], "first token"
    if name in ("steady", "during"):
        times, t = [], rng.expovariate(args.rate)
        while t < args.steady_s:
            times.append(t)
            t += rng.expovariate(args.rate)
        return times, "first token" if name == "steady" else "sent"
    raise SystemExit(f"--scenarios: no scenario {name!r}")


def lead(starts: list[float]) -> float:
    """How long before the long request the first chat goes ('before': 0.3 s)."""
    return -min(0.0, *starts)


def vllm_last(serve_args: list[str], *vllm_args: str) -> list[str]:
    """`vllm-offload serve` flags, then "--" and vLLM's own (those already after a "--" in
    ``serve_args`` kept)."""
    if "--" not in serve_args:
        return [*serve_args, "--", *vllm_args]
    return [*serve_args, *vllm_args]


def chats_at(
    url: str, prompts: list[list[int]], starts: list[float], t0: float, out: int
) -> list[Answer]:
    """Each chat sent at t0 + its start time (perf_counter seconds)."""

    def one(prompt: list[int], start: float) -> Answer:
        time.sleep(max(0.0, t0 + start - time.perf_counter()))
        return stream(url, prompt, out)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts, starts))


def beside(
    url: str,
    long_prompt: list[int],
    prompts: list[list[int]],
    starts: list[float],
    anchor: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The long request in a thread, the chats at their times from its sending or its
    first token; the long request's decode rate while chats ran and after."""
    long = Answer(began=0.0)
    sent = time.perf_counter() + lead(starts)

    def long_request() -> None:
        time.sleep(max(0.0, sent - time.perf_counter()))
        stream(url, long_prompt, args.long_out, answer=long)

    thread = threading.Thread(target=long_request)
    thread.start()
    t0 = sent
    if anchor == "first token":
        while thread.is_alive() and not long.times:
            time.sleep(0.01)
        t0 = time.perf_counter()
    got = chats_at(url, prompts, starts, t0, args.chat_out)
    thread.join()
    if long.refused or not long.times:
        return {"long_refused": long.refused or "no token", "chats": [c.to_json() for c in got]}
    first_chat = min(c.began for c in got)
    last_chat = max(c.began + c.times[-1] for c in got if c.times)
    during = [t for t in long.times if first_chat <= long.began + t <= last_chat]
    after = [t for t in long.times if long.began + t > last_chat]
    return {
        "chats": [c.to_json() for c in got],
        "long": long.to_json(),
        "long_ttft_s": long.ttft_s,
        "long_tokens": len(long.times),
        "long_tok_per_s_beside_chats": len(during) / (last_chat - first_chat) if during else 0.0,
        "long_tok_per_s_after": (len(after) - 1) / (after[-1] - after[0])
        if len(after) > 2
        else None,
    }


def share_of(before: str, after: str) -> tuple[float | None, float | None]:
    """The share the scheduler logged for the long request between two reads of the log
    (spilled and its bound from below); None where it logged none."""
    old, new = shares_logged(before), shares_logged(after)
    if len(new) <= len(old):
        return None, None
    (s0, low0, t0), (s1, low1, t1) = old[-1] if old else (0.0, 0.0, 0.0), new[-1]
    if t1 <= t0:
        return None, None
    return (s1 - s0) / (t1 - t0), (low1 - low0) / (t1 - t0)


def shares_logged(log: str) -> list[tuple[float, float, float]]:
    """(spilled, at least, total) seconds per line; lines before the bound from below gave
    only the first."""
    return [(float(a), float(low or a), float(t)) for a, low, t in SHARE_LINE.findall(log)]


Chats = list[dict[str, Any]]  # each chat's Answer as JSON
Share = tuple[float | None, float | None]  # spilled and its bound from below


def runs(
    server: ServerProcess,
    alone_only: bool,
    starts: list[float],
    anchor: str,
    args: argparse.Namespace,
    prompt: Callable[[int], list[int]],
    deadline: float,
) -> tuple[list[Chats], list[dict[str, Any]], list[Share]]:
    """--repeats runs on one server, alone and beside in turn, fresh prompts each time (an
    earlier run's are in the prefix cache): the chats alone, beside the long request, and
    the share logged for each."""
    alones: list[Chats] = []
    besides: list[dict[str, Any]] = []
    shares: list[Share] = []
    url = server.base_url
    for n in range(args.repeats):
        if n and time.monotonic() > deadline:
            break
        prompts = [prompt(args.chat_in) for _ in starts]
        at = time.perf_counter() + lead(starts)
        alones.append([c.to_json() for c in chats_at(url, prompts, starts, at, args.chat_out)])
        if alone_only:
            continue
        logged = server.log_path.read_text(errors="replace")
        others = [prompt(args.chat_in) for _ in starts]
        long_prompt = prompt(args.long_tokens)  # nothing of it cached either
        besides.append(beside(url, long_prompt, others, starts, anchor, args))
        time.sleep(0.5)  # the line is logged as the long request ends
        shares.append(share_of(logged, server.log_path.read_text(errors="replace")))
    return alones, besides, shares


def arm_summary(
    alones: list[Chats], besides: list[dict[str, Any]], shares: list[Share]
) -> dict[str, Any]:
    """One arm's record of a scenario: the tails are the first run's; the ratios (runs whose
    long request was refused left out: their chats ran alone) and the share over every run."""
    arm: dict[str, Any] = {"alone": alones[0], "alone_tails": tails_summary(alones[0])}
    ran = [b for b in besides if "long_refused" not in b]
    if besides:
        arm["beside"] = besides[0]
        arm["beside_tails"] = tails_summary(besides[0]["chats"])
        for n, key in enumerate(("measured_share", "measured_share_low")):
            measured = [v for s in shares if (v := s[n]) is not None]
            arm[key] = statistics.median(measured) if measured else None
    if ran:
        arm["ratios"] = chat_ratios(
            per_chat_median(alones), per_chat_median([b["chats"] for b in ran])
        )
    if len(alones) > 1:
        arm["repeats"] = {"alone": alones[1:], "beside": besides[1:], "measured_shares": shares}
        arm["alone_spread"] = alone_spread(alones)
    return arm


def print_arm(scenario: str, name: str, arm: dict[str, Any]) -> None:
    shown = ("alone_tails", "beside_tails", "measured_share", "measured_share_low")

    def worst(table: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in table.items() if k.startswith(("worst", "chats"))}

    print(
        scenario,
        name,
        {k: arm.get(k) for k in shown},
        worst(arm.get("ratios", {})),
        "alone spread",
        worst(arm.get("alone_spread", {})),
        flush=True,
    )


def make_arms(args: argparse.Namespace, model: Path) -> list[Arm]:
    """The arms of the module's docstring, those --arms keeps."""
    pool = ["--gpu-kv-cache-memory-bytes", str(int(args.pool_gib * GIB))]
    flags = {"gpu-only": pool}
    for share in args.shares.split(","):
        flags[f"share-{share}"] = [
            *pool,
            f"--kv-offload-host-extension-gib={args.extension_gib}",
            f"--kv-offload-spilled-step-share={share}",
        ]
        for cap in filter(None, args.caps.split(",")):
            flags[f"share-{share}-cap{cap}"] = [
                *flags[f"share-{share}"],
                "--",
                f"--long-prefill-token-threshold={cap}",
            ]
    switched = {
        f"{name}-switch{interval}": (name, interval)
        for name in list(flags)
        if name.startswith("share-")
        for interval in filter(None, args.switch_intervals.split(","))
    }
    flags.update({name: flags[base] for name, (base, _) in switched.items()})
    env = {name: {"BENCH_SWITCH_INTERVAL_S": interval} for name, (_, interval) in switched.items()}
    if args.base_tree:
        base_env = tree_env(args.base_tree)
        for share in args.shares.split(","):
            flags[f"share-{share}-base"] = flags[f"share-{share}"]
            env[f"share-{share}-base"] = base_env
    if args.all_gpu_pool_gib:
        flags["all-gpu"] = ["--gpu-kv-cache-memory-bytes", str(int(args.all_gpu_pool_gib * GIB))]
    ours = ["--model", str(model), "--gpu-memory-utilization", str(args.utilization)]
    ours += ["--kv-offload-backend", "none", "--gpu-prefill-chunk-tokens", str(args.chunk_tokens)]
    kept = set(filter(None, args.arms.split(","))) or set(flags)
    return [
        Arm(
            name=n,
            serve_args=vllm_last([*ours, *f], "--load-format=dummy"),
            env=env.get(n, {}),
        )
        for n, f in flags.items()
        if n in kept
    ]


def main() -> None:
    parser = options.parser(
        __doc__, pool_gib=2.0, extension_gib=12.0, long_tokens=60000, chunk_tokens=8192
    )
    parser.add_argument("--long-out", type=int, default=160)
    parser.add_argument("--chat-in", type=int, default=256)
    parser.add_argument("--chat-out", type=int, default=128)
    parser.add_argument("--scenarios", default="wave16,wave32,before,with,waves,steady")
    parser.add_argument("--rate", type=float, default=4.0, help="steady: chats a second")
    parser.add_argument("--steady-s", type=float, default=15.0)
    parser.add_argument("--shares", default="0.1")
    parser.add_argument("--caps", default="", help="long prompts' chunk beside others, e.g. 2048")
    parser.add_argument("--all-gpu-pool-gib", type=float, default=0.0, help="0: no such arm")
    parser.add_argument("--switch-intervals", default="", help="seconds, e.g. 0.0005")
    parser.add_argument("--base-tree", type=Path, help="share-S-base arms: vllm_offload from here")
    parser.add_argument("--arms", default="", help="only these arms, e.g. share-0.1,all-gpu")
    parser.add_argument("--utilization", type=float, default=0.3, help="per server")
    parser.add_argument("--model", type=Path, help="a model folder (default: the 8B shape)")
    parser.add_argument("--deadline-s", type=float, default=1e9, help="skip what starts later")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alone and beside runs per arm, in turn"
    )
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline_s  # no scenario nor repeat starts after it
    model = args.model or write_model(Path("/tmp/fairness-model"), None)
    arms = make_arms(args, model)
    record = Record(args.out / "fairness.json", vars(args))
    rng = random.Random(54)  # arrivals: the same whatever the arms and repeats
    ids = random.Random(4254)

    def prompt(tokens: int) -> list[int]:  # random ids: no prefix is shared
        return [ids.randrange(VOCAB // 100, VOCAB * 3 // 4) for _ in range(tokens)]

    with serving(arms, args.out) as up:
        record["starts"], servers = up["starts"], up["servers"]
        for name, server in servers.items():
            record["starts"][name]["split"] = split_line(
                server.log_path.read_text(errors="replace")
            )
            stream(server.base_url, prompt(args.chat_in), 8)  # warm
        record["scenarios"] = {}
        for scenario in args.scenarios.split(","):
            if time.monotonic() > deadline:
                record["skipped"] = [*record.get("skipped", []), scenario]
                continue
            starts, anchor = arrivals(scenario, args, rng)
            shown: dict[str, Any] = {"anchor": anchor, "starts_s": starts}
            record["scenarios"][scenario] = shown
            for name, server in servers.items():
                done = runs(server, name == "gpu-only", starts, anchor, args, prompt, deadline)
                shown[name] = arm = arm_summary(*done)
                print_arm(scenario, name, arm)
                record.save()
    record.save()


if __name__ == "__main__":
    main()
