"""The `vllm-offload` command: one small module per subcommand."""

from __future__ import annotations

import argparse
import sys

from vllm_offload import __version__
from vllm_offload.cli import (
    _common,
    bench_cmd,
    cache_cmd,
    config_cmd,
    demo_model_cmd,
    load_cmd,
    manager_cmd,
    patch_cmd,
    plan_cmd,
    ps_cmd,
    pull_cmd,
    serve,
    service_cmd,
)
from vllm_offload.errors import VllmOffloadError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-offload",
        description="Offload-aware vLLM for one-GPU servers: plans the GPU KV pool and the "
        "CPU tier, and serves the OpenAI API.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        serve,
        ps_cmd,
        load_cmd,
        plan_cmd,
        pull_cmd,
        config_cmd,
        manager_cmd,
        service_cmd,
        patch_cmd,
        bench_cmd,
        cache_cmd,
        demo_model_cmd,
    ):
        module.add_parser(subparsers)
    return parser


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of one subcommand."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = commands.choices[command]
    return chosen


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    try:
        if unknown:
            raise _common.unknown_arguments(
                args.command, command_parser(parser, args.command), unknown
            )
        return int(args.handler(args, extra))
    except VllmOffloadError as exc:
        print(f"vllm-offload: error: {exc}", file=sys.stderr)
        return exc.exit_code
