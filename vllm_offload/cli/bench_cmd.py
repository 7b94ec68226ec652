"""`vllm-offload bench`: baseline vs CPU KV tier (vs LMCache) on this host, one command."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path

from vllm_offload.bench import harness, report, workloads
from vllm_offload.cli._common import UsageError


def _rates(text: str) -> list[workloads.Rate]:
    rates: list[workloads.Rate] = []
    for item in text.split(","):
        if item == "sync":
            rates.append(None)
            continue
        if item == workloads.MAX_RATE:
            rates.append(item)
            continue
        try:
            rate = float(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{item!r}: a rate is 'sync', 'max' or req/s > 0"
            ) from None
        if rate <= 0:
            raise argparse.ArgumentTypeError(f"{item!r}: a rate must be > 0")
        rates.append(rate)
    return rates


def _counts(text: str) -> list[int]:
    try:
        counts = [int(item) for item in text.split(",") if item]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma list of whole numbers") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: each must be at least 1")
    return counts


def _names(allowed: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n for n in text.split(",") if n]
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(allowed)}")
        return names

    return parse


def _arm(text: str) -> harness.Arm:
    try:
        return harness.Arm.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure baseline vs CPU KV tier: reuse, chat, rate sweep, decode, memory",
        description="Start one server per arm through the launcher (same model, same GPU "
        "pool), run the workloads interleaved and repeated, write results.json, "
        "summary.csv, summary.md and PNG plots. Arguments after `--` go to vLLM.",
    )
    p.add_argument("--model", type=Path, required=True, help="HF model directory")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument(
        "--arms",
        type=_names(harness.ARM_KINDS),
        help="comma list of baseline,native,lmcache (default: baseline,native unless --arm)",
    )
    p.add_argument(
        "--arm",
        type=_arm,
        action="append",
        default=[],
        metavar="LABEL=KIND [FLAGS]",
        help="a further arm with its own serve flags (then `--` and vLLM arguments), e.g. "
        "'c256=native --kv-offload-cpu-chunk-tokens 256' or "
        "'uva8=baseline --weights-offload-cpu-gib 8'; repeatable",
    )
    p.add_argument(
        "--workloads",
        type=_names(harness.WORKLOADS),
        default=list(harness.DEFAULT_WORKLOADS),
        help="comma list of reuse,chat,sweep,decode,memory (default: all but decode)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--docs", type=int, default=8, help="reuse: documents")
    p.add_argument("--doc-tokens", type=int, default=8000, help="reuse: tokens per document")
    p.add_argument(
        "--settle-seconds",
        type=float,
        default=0.5,
        help="reuse: pause before each request, so the last one's copies to the CPU tier "
        "have finished",
    )
    p.add_argument(
        "--hit-concurrency",
        type=_counts,
        default=[],
        metavar="N[,N...]",
        help="reuse: after the passes, for each N: N new documents read, the GPU prefix "
        "cache dropped (servers get VLLM_SERVER_DEV_MODE=1), the N read again at once "
        "(CPU hits) and once more (GPU hits); the GPU pool must hold N documents",
    )
    p.add_argument("--conversations", type=int, default=4, help="chat: conversations")
    p.add_argument("--turns", type=int, default=4, help="chat: turns per conversation")
    p.add_argument("--turn-tokens", type=int, default=1000, help="chat: user tokens per turn")
    p.add_argument(
        "--rates",
        type=_rates,
        default=[None, 8.0, 32.0],
        help="sweep: comma list of 'sync', req/s (Poisson) and 'max' (closed loop)",
    )
    p.add_argument("--rate-seconds", type=float, default=10.0, help="sweep: seconds per rate")
    p.add_argument("--max-concurrency", type=int, default=64, help="sweep: clients at rate 'max'")
    p.add_argument(
        "--decode-batch", type=int, default=16, help="decode: requests decoding side by side"
    )
    p.add_argument("--prompt-tokens", type=int, default=512, help="sweep: prompt tokens")
    p.add_argument("--output-tokens", type=int, default=64, help="fixed output (ignore_eos)")
    p.add_argument("--tier-gib", type=float, default=16.0, help="CPU tier of the offload arms")
    p.add_argument("--pool-bytes", type=int, help="cap the GPU KV pool (same for every arm)")
    p.add_argument(
        "--gpu-memory-utilization", type=float, help="per server (arms run side by side on one GPU)"
    )
    p.add_argument(
        "--token-ids",
        action="store_true",
        help="send token-id prompts (models served with --skip-tokenizer-init)",
    )
    p.add_argument(
        "--h2d-gbps",
        type=float,
        help="host->GPU bandwidth for the CPU-hit floor (benchmarks/pinned_memory.py)",
    )
    p.add_argument(
        "--serve-flags",
        default="",
        help="more `vllm-offload serve` flags for every arm, e.g. "
        "'--kv-offload-cpu-chunk-tokens 256'",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    for name in (
        "repeats",
        "docs",
        "doc_tokens",
        "conversations",
        "turns",
        "turn_tokens",
        "output_tokens",
        "prompt_tokens",
        "max_concurrency",
        "decode_batch",
    ):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: must be at least 1")
    if args.settle_seconds < 0:
        raise UsageError("--settle-seconds: must be >= 0")
    arms = [
        harness.Arm(kind, kind)
        for kind in args.arms or ([] if args.arm else ["baseline", "native"])
    ]
    arms += args.arm
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--arm: labels must differ, got {', '.join(labels)}")
    if not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there")
    options = harness.BenchOptions(
        model=args.model.absolute(),
        out=args.out,
        arms=arms,
        workloads=args.workloads,
        repeats=args.repeats,
        docs=args.docs,
        doc_tokens=args.doc_tokens,
        settle_s=args.settle_seconds,
        hit_concurrency=args.hit_concurrency,
        conversations=args.conversations,
        turns=args.turns,
        turn_tokens=args.turn_tokens,
        rates=args.rates,
        rate_seconds=args.rate_seconds,
        max_concurrency=args.max_concurrency,
        decode_batch=args.decode_batch,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        tier_gib=args.tier_gib,
        pool_bytes=args.pool_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        token_ids=args.token_ids,
        h2d_gbps=args.h2d_gbps,
        serve_flags=shlex.split(args.serve_flags),
        vllm_args=extra_args,
    )
    results = harness.run(options)
    for path in report.write(results, args.out):
        print(f"wrote {path}")
    print(json.dumps({"floor": results["floor"], "decode_floor": results["decode_floor"]}))
    # An arm whose server died (said as it happened) fails the command; the others' numbers
    # are written all the same.
    return 1 if any("failed" in arm for arm in results["arms"].values()) else 0
