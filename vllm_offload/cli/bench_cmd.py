"""`vllm-offload bench`: baseline vs CPU KV tier (vs LMCache) on this host, one command."""

from __future__ import annotations

import argparse
import json

from vllm_offload.bench import harness, options, report
from vllm_offload.cli._common import UsageError


def _arm(text: str) -> options.Arm:
    try:
        return options.Arm.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kinds(text: str) -> list[str]:
    try:
        return options.names(options.ARM_KINDS)(text)
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
    p.add_argument(
        "--arms",
        type=_kinds,
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
    options.add_arguments(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    arms = [
        options.Arm(label=kind, kind=kind)
        for kind in args.arms or ([] if args.arm else ["baseline", "native"])
    ]
    arms += args.arm
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise UsageError(f"--arm: labels must differ, got {', '.join(labels)}")
    if not (args.model / "config.json").is_file():
        raise UsageError(f"--model {args.model}: no config.json there")
    chosen = options.from_args(args, arms, extra_args)
    chosen.model = chosen.model.absolute()
    results = harness.run(chosen)
    for path in report.write(results, chosen.out):
        print(f"wrote {path}")
    print(json.dumps({"floor": results["floor"], "decode_floor": results["decode_floor"]}))
    # An arm whose server died (said as it happened) fails the command; the others' numbers
    # are written all the same.
    return 1 if any("failed" in arm for arm in results["arms"].values()) else 0
