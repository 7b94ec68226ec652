"""`vllm-offload demo-model DIR`: write the tiny random Llama."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_offload import demo_model


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo-model",
        help="write a tiny random-weight Llama (tokenizer and chat template included)",
        description="Write a tiny random-weight Llama with a locally built tokenizer and a "
        "chat template into DIR, so a server can run with no download.",
    )
    parser.add_argument("dir", type=Path, help="directory to write (created)")
    parser.add_argument(
        "--seed", type=int, default=0, help="random seed: another seed, another model"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    print(demo_model.write(args.dir, seed=args.seed))
    return 0
