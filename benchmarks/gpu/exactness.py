#!/usr/bin/env python3
"""Issue #54: the same greedy answer on every start. Each arm is a fresh `vllm-offload
serve` process with a cold compile cache (its own, emptied), the arms of a round all up at
once, rounds one after the other (each a fresh set of processes); each answers the same
prompts (random token ids, seeded), greedy, --output-tokens with 5 logprobs, and every
answer is compared with the reference arm's (the first --reference arm, or the one of an
earlier call's record given with --against: the same checkpoint on the same machine). The
reference kinds in --controls also answer each prompt's control (one token changed 3/4 of
the way in, where a staged pool keeps it in host RAM): the check must see a difference
there. The kernel configs Inductor chose by timing are kept per arm and round
(kit.arms.kernel_choices); with --timing each arm's start phases, a fresh long prompt's
TTFT and a chat batch's throughput are measured, one arm at a time.

Arm kinds (--rounds: rounds separated by ';', each a comma list of kinds, KIND*N for N of
one kind): gpu-default / gpu-repro (an all-GPU pool of --gpu-pool-gib,
server.reproducible false / true), staged-default / staged-repro (a --staged-pool-gib GPU
pool + --extension-gib of host RAM, staged prefill), staged-repro-share1 (share 1),
staged-repro-pool4 (a 4 GiB GPU part), inplace-repro (staged_prefill false; it answers
--inplace-lengths). Prefix caching is off: a prompt computed in other chunks is other GEMM
shapes, which may round differently on any server.

    benchmarks/gpu/exactness.py --out DIR --checkpoint /root/ckpt-llama-3.1-8b \\
        --rounds 'gpu-repro,staged-repro*3;staged-repro*2,staged-repro-share1*2' [--timing]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.arms import Arm, kernel_choices, serving
from kit.model import GIB, VOCAB, random_checkpoint, split_line
from kit.record import Record
from kit.stream import Answer, compare, stream, tail


def kind_of(label: str) -> str:
    """An arm's kind from its label ('staged-repro.2' is the second staged-repro)."""
    return label.split(".")[0]


def rounds(spec: str) -> list[list[str]]:
    """Each round's arm labels: 'gpu-repro,staged-repro*2' -> gpu-repro, staged-repro,
    staged-repro.2."""
    made = []
    for part in spec.split(";"):
        labels: list[str] = []
        for item in part.split(","):
            kind, _, count = item.strip().partition("*")
            for _ in range(int(count or 1)):
                seen = sum(kind_of(label) == kind for label in labels)
                labels.append(kind if not seen else f"{kind}.{seen + 1}")
        made.append(labels)
    return made


def arm_flags(kind: str, args: argparse.Namespace) -> list[str]:
    pool, *rest = kind.split("-")
    kernels = rest[0]
    flags = [f"--server-reproducible={'true' if kernels == 'repro' else 'false'}"]
    if pool == "gpu":
        return [*flags, "--gpu-kv-cache-memory-bytes", str(int(args.gpu_pool_gib * GIB))]
    gpu_part = 4.0 if "pool4" in rest else args.staged_pool_gib
    flags += [
        "--gpu-kv-cache-memory-bytes",
        str(int(gpu_part * GIB)),
        f"--kv-offload-host-extension-gib={args.extension_gib}",
    ]
    if "share1" in rest:
        flags.append("--kv-offload-spilled-step-share=1")
    if pool == "inplace":
        flags.append("--kv-offload-staged-prefill=false")
    return flags


def prompts(lengths: list[int], seed: int) -> dict[str, list[int]]:
    """Each length's prompt and its control (one token changed 3/4 of the way in); a
    length's prompt is the same whatever other lengths are asked."""
    made = {}
    for length in lengths:
        rng = random.Random(seed * 1_000_003 + length)
        prompt = [rng.randrange(VOCAB // 100, VOCAB * 3 // 4) for _ in range(length)]
        control = list(prompt)
        control[length * 3 // 4] = (control[length * 3 // 4] + 1) % VOCAB
        made[f"{length}"], made[f"{length}-control"] = prompt, control
    return made


def asked_of(label: str, index: int, args: argparse.Namespace) -> dict[str, list[int]]:
    """What one arm answers: its lengths' prompts, and their controls for --controls kinds.
    An all-GPU arm answers every length; the ``index``-th arm of a round, with
    --lengths-per-arm N, the N lengths from the index-th on (a round's arms share the
    lengths out: the GPU's time, not the starts, is what a round waits on)."""
    kind = kind_of(label)
    lengths = (args.inplace_lengths if kind.startswith("inplace") else args.lengths).split(",")
    if not kind.startswith("gpu") and args.lengths_per_arm:
        lengths = [lengths[(index + k) % len(lengths)] for k in range(args.lengths_per_arm)]
    every = prompts([int(n) for n in lengths], args.seed)
    controls = kind in args.controls.split(",")
    return {key: p for key, p in every.items() if controls or not key.endswith("-control")}


def answers(url: str, asked: dict[str, list[int]], output_tokens: int) -> dict[str, Any]:
    return {
        key: stream(url, prompt, output_tokens, logprobs=5).to_json()
        for key, prompt in asked.items()
    }


def timing(url: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """A fresh long prompt's TTFT (no prefix to reuse) and --chats chats at once."""
    long = [rng.randrange(VOCAB // 100, VOCAB * 3 // 4) for _ in range(args.timing_tokens)]
    began = time.perf_counter()
    first = stream(url, long, 8)
    chats = [
        [rng.randrange(VOCAB // 100, VOCAB * 3 // 4) for _ in range(256)] for _ in range(args.chats)
    ]
    batch_began = time.perf_counter()
    with ThreadPoolExecutor(len(chats)) as pool:
        done = list(pool.map(lambda p: stream(url, p, 128), chats))
    batch_s = time.perf_counter() - batch_began
    tails = [tail(a.times) for a in done]
    return {
        "long_ttft_s": first.ttft_s,
        "long_total_s": time.perf_counter() - began - batch_s,
        "chats_tok_per_s": sum(len(a.times) for a in done) / batch_s,
        "chats_mean_tpot_s": sorted(t["mean_tpot_s"] for t in tails if t),
    }


def differences(got: dict[str, dict[str, Any]], reference: dict[str, Any]) -> dict[str, Any]:
    """Every arm's answer to every prompt against the reference's; each control against
    the same arm's answer without the change."""
    against = {
        label: {
            key: compare(Answer.from_json(answer), Answer.from_json(reference[key]))
            for key, answer in by_prompt.items()
            if not key.endswith("-control") and key in reference
        }
        for label, by_prompt in got.items()
    }
    controls = {
        label: {
            key: compare(Answer.from_json(by_prompt[key + "-control"]), Answer.from_json(answer))
            for key, answer in by_prompt.items()
            if key + "-control" in by_prompt
        }
        for label, by_prompt in got.items()
    }
    return {"against_reference": against, "controls": {k: v for k, v in controls.items() if v}}


def exact(d: dict[str, Any]) -> bool:
    return bool(d["same_tokens"] and d["same_logprobs"])


def shown(d: dict[str, Any]) -> str:
    return "same" if exact(d) else f"token {d['first_difference']}, max {d['max_logprob_diff']}"


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """Per arm and prompt: the same as the reference (tokens and logprobs) or where they
    part; the count of answers that differ from it, by kind; whether every control moved."""
    by_arm: dict[str, Any] = {}
    tally: dict[str, list[int]] = {}
    for n, done in enumerate(record["rounds"], 1):
        for label, by_prompt in done.get("differences", {}).get("against_reference", {}).items():
            if f"r{n}/{label}" == record.get("reference_from"):
                continue  # the reference itself
            by_arm[f"r{n}/{label}"] = {key: shown(d) for key, d in by_prompt.items()}
            counted = tally.setdefault(kind_of(label), [0, 0])
            counted[0] += sum(not exact(d) for d in by_prompt.values())
            counted[1] += len(by_prompt)
    controls = [
        exact(d)
        for done in record["rounds"]
        for by_prompt in done.get("differences", {}).get("controls", {}).values()
        for d in by_prompt.values()
    ]
    return {
        "reference": record.get("reference_from"),
        "arms": by_arm,
        "differ_from_reference": {kind: f"{a} of {b}" for kind, (a, b) in tally.items()},
        "controls_moved": f"{controls.count(False)} of {len(controls)}",
    }


def round_arms(labels: list[str], model: Path, args: argparse.Namespace) -> list[Arm]:
    utilization = dict(part.split("=") for part in args.utilization.split(","))
    made = []
    for label in labels:
        kind = kind_of(label)
        flags = [
            "--model",
            str(model),
            "--gpu-memory-utilization",
            utilization[kind.split("-")[0]],
            "--kv-offload-backend",
            "none",
            *arm_flags(kind, args),
            # A control shares 3/4 of its prompt: a prefix hit would compute it in other
            # chunks (other GEMM shapes) on one server than on another
            "--",
            "--no-enable-prefix-caching",
        ]
        made.append(
            Arm(name=label, serve_args=flags, cache=args.cache_root / label, cold=not args.warm)
        )
    return made


def one_round(
    labels: list[str], model: Path, args: argparse.Namespace, out: Path
) -> dict[str, Any]:
    """Start the round's arms at once, ask each its prompts, stop them."""
    arms = round_arms(labels, model, args)
    done: dict[str, Any] = {}
    with serving(arms, out) as up:
        done["starts"] = up["starts"]
        servers = up["servers"]
        for name, server in servers.items():
            done["starts"][name]["split"] = split_line(server.log_path.read_text(errors="replace"))
        with ThreadPoolExecutor(max(1, len(servers))) as pool:  # numerics need no quiet GPU
            done["answers"] = dict(
                zip(
                    servers,
                    pool.map(
                        lambda item: answers(
                            item[1].base_url,
                            asked_of(item[0], labels.index(item[0]), args),
                            args.output_tokens,
                        ),
                        servers.items(),
                    ),
                    strict=True,
                )
            )
        done["kernel_choices"] = {a.name: kernel_choices(a.cache) for a in arms if a.cache}
        if args.timing:  # one arm at a time, in turn
            rng = random.Random(args.seed + 1)
            done["timing"] = {name: timing(s.base_url, args, rng) for name, s in servers.items()}
    return done


def main() -> None:
    parser = options.parser(__doc__, output_tokens=32, extension_gib=16.0)
    parser.add_argument("--checkpoint", type=Path, required=True, help="written if missing")
    parser.add_argument("--rounds", default="gpu-default,gpu-repro,staged-default,staged-repro")
    parser.add_argument("--lengths", default="1000,60000")
    parser.add_argument("--inplace-lengths", default="40000")
    parser.add_argument("--lengths-per-arm", type=int, default=0, help="0: every length")
    parser.add_argument("--controls", default="gpu-repro,gpu-default", help="kinds with controls")
    parser.add_argument("--reference", default="gpu-repro", help="the reference arm's kind")
    parser.add_argument("--against", type=Path, help="an earlier call's exactness.json")
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--gpu-pool-gib", type=float, default=17.0)
    parser.add_argument("--staged-pool-gib", type=float, default=2.0)
    parser.add_argument("--utilization", default="gpu=0.3,staged=0.2,inplace=0.2")
    parser.add_argument("--cache-root", type=Path, default=Path("/root/compile-caches"))
    parser.add_argument("--warm", action="store_true", help="keep each arm's compile cache")
    parser.add_argument("--deadline-s", type=float, default=1e9, help="no round begun past it")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--timing-tokens", type=int, default=60000)
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--call", default="", help="this call's name in the record")
    args = parser.parse_args()
    began = time.monotonic()
    model = random_checkpoint(args.checkpoint)
    record = Record(args.out / "exactness.json", vars(args))
    record["rounds"] = []
    reference: dict[str, Any] | None = None
    if args.against:
        earlier = json.loads(args.against.read_text())
        reference, record["reference_from"] = earlier["reference"], earlier["reference_from"]
        record["reference_from"] += f" ({args.against})"
    slowest = 0.0
    for n, labels in enumerate(rounds(args.rounds), 1):
        if time.monotonic() - began + slowest > args.deadline_s:
            record["rounds_left"] = args.rounds.split(";")[n - 1 :]
            break
        round_began = time.monotonic()
        done = one_round(labels, model, args, args.out / f"r{n}")
        if reference is None:
            first = next((label for label in labels if kind_of(label) == args.reference), None)
            if first and first in done["answers"]:
                reference = done["answers"][first]
                record["reference_from"] = f"r{n}/{first}"
                record["reference"] = reference
        if reference is not None:
            done["differences"] = differences(done["answers"], reference)
        record["rounds"].append(done)
        record.save()
        slowest = max(slowest, time.monotonic() - round_began)
    record["summary"] = summary(record)
    record.save()
    print(
        json.dumps(
            {"starts": [r["starts"] for r in record["rounds"]], **record["summary"]}, indent=1
        )
    )


if __name__ == "__main__":
    main()
