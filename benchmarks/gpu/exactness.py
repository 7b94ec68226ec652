#!/usr/bin/env python3
"""Issue #54: the same greedy answer on every start. Each arm is a fresh `vllm-offload
serve` process with a cold compile cache (its own, emptied), all up at once; each answers
the same prompts (random token ids, seeded: a short one that never reaches a host block,
long ones that do, and for each a control with one token changed 3/4 of the way in, where
a staged pool keeps it in host RAM), greedy, --output-tokens with 5 logprobs. Answers are
compared across arms and with the answers of earlier calls (--against), the kernel
configs Inductor chose by timing are kept per arm (kit.arms.kernel_choices), and with
--timing each arm's start phases, a fresh long prompt's TTFT and a chat batch's
throughput are measured, one arm at a time.

Arms (--arms, any of): gpu-default / gpu-repro (an all-GPU pool of --gpu-pool-gib,
server.reproducible false / true), staged-default / staged-repro (a --staged-pool-gib GPU
pool + --extension-gib of host RAM, staged prefill), staged-repro-share1 (share 1),
staged-repro-pool4 (a 4 GiB GPU part), inplace-repro (staged_prefill false). Prefix
caching is off: a prompt computed in other chunks is other GEMM shapes, which may round
differently on any server.

    benchmarks/gpu/exactness.py --out DIR --checkpoint /root/ckpt-llama-3.1-8b [--timing]
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


def arm_flags(name: str, args: argparse.Namespace) -> list[str]:
    pool, *rest = name.split("-")
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
    """Each length's prompt and its control (one token changed 3/4 of the way in)."""
    rng = random.Random(seed)
    made = {}
    for length in lengths:
        prompt = [rng.randrange(VOCAB // 100, VOCAB * 3 // 4) for _ in range(length)]
        control = list(prompt)
        control[length * 3 // 4] = (control[length * 3 // 4] + 1) % VOCAB
        made[f"{length}"], made[f"{length}-control"] = prompt, control
    return made


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


def differences(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every pair of arms on every prompt, and each arm's control against its own answer."""
    names = sorted(results)
    pairs = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            pairs[f"{a} vs {b}"] = {
                key: compare(Answer.from_json(results[a][key]), Answer.from_json(results[b][key]))
                for key in results[a]
                if key in results[b]
            }
    controls = {
        name: {
            key: compare(Answer.from_json(got[key + "-control"]), Answer.from_json(got[key]))
            for key in got
            if not key.endswith("-control") and key + "-control" in got
        }
        for name, got in results.items()
    }
    return {"pairs": pairs, "controls": controls}


def main() -> None:
    parser = options.parser(__doc__, output_tokens=32, extension_gib=16.0)
    parser.add_argument("--checkpoint", type=Path, required=True, help="written if missing")
    parser.add_argument("--arms", default="gpu-default,gpu-repro,staged-default,staged-repro")
    parser.add_argument("--lengths", default="1000,60000")
    parser.add_argument("--seed", type=int, default=54)
    parser.add_argument("--gpu-pool-gib", type=float, default=17.0)
    parser.add_argument("--staged-pool-gib", type=float, default=2.0)
    parser.add_argument("--utilization", default="gpu=0.3,staged=0.2,inplace=0.2")
    parser.add_argument("--cache-root", type=Path, default=Path("/root/compile-caches"))
    parser.add_argument("--warm", action="store_true", help="keep each arm's compile cache")
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--timing-tokens", type=int, default=60000)
    parser.add_argument("--chats", type=int, default=16)
    parser.add_argument("--call", default="", help="this call's name in the record")
    args = parser.parse_args()
    model = random_checkpoint(args.checkpoint)
    utilization = dict(part.split("=") for part in args.utilization.split(","))
    arms = []
    for name in args.arms.split(","):
        flags = [
            "--model",
            str(model),
            "--gpu-memory-utilization",
            utilization[name.split("-")[0]],
            "--kv-offload-backend",
            "none",
            *arm_flags(name, args),
            # A control shares 3/4 of its prompt: a prefix hit would compute it in other
            # chunks (other GEMM shapes) on one server than on another
            "--",
            "--no-enable-prefix-caching",
        ]
        arms.append(
            Arm(name=name, serve_args=flags, cache=args.cache_root / name, cold=not args.warm)
        )
    record = Record(args.out / "exactness.json", vars(args))
    asked = prompts([int(n) for n in args.lengths.split(",")], args.seed)
    with serving(arms, args.out) as up:
        record["starts"] = up["starts"]
        servers = up["servers"]
        for name, server in servers.items():
            record["starts"][name]["split"] = split_line(
                server.log_path.read_text(errors="replace")
            )
        record.save()
        with ThreadPoolExecutor(max(1, len(servers))) as pool:  # numerics need no quiet GPU
            got = dict(
                zip(
                    servers,
                    pool.map(
                        lambda s: answers(s.base_url, asked, args.output_tokens), servers.values()
                    ),
                    strict=True,
                )
            )
        record["answers"] = got
        record["differences"] = differences(got)
        record["kernel_choices"] = {a.name: kernel_choices(a.cache) for a in arms if a.cache}
        record.save()
        if args.timing:  # one arm at a time, in turn
            rng = random.Random(args.seed + 1)
            record["timing"] = {name: timing(s.base_url, args, rng) for name, s in servers.items()}
            record.save()
    print(json.dumps({"starts": record["starts"], "differences": summary(record)}, indent=1))


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """Per pair and per prompt: same (tokens and logprobs), or where they part and by how much."""
    shown: dict[str, Any] = {}
    for kind, table in record["differences"].items():
        for pair, by_prompt in table.items():
            shown[f"{kind}: {pair}"] = {
                key: "same"
                if d["same_tokens"] and d["same_logprobs"]
                else f"token {d['first_difference']}, max {d['max_logprob_diff']}"
                for key, d in by_prompt.items()
            }
    return shown


if __name__ == "__main__":
    main()
