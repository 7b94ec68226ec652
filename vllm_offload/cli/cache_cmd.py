"""`vllm-offload cache clear`: empty the disk KV tier while the server is stopped."""

from __future__ import annotations

import argparse

from vllm_offload import disk_layout
from vllm_offload.cli import _common


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cache",
        help="clear the disk KV tier (kv_offload.disk_path)",
        description="Delete the disk tier's files (its block files and folders, nothing "
        "else) under the config's kv_offload.disk_path. Refused while a server uses it.",
    )
    parser.add_argument("action", choices=["clear"])
    _common.add_config_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    files, removed = disk_layout.clear_tier(config.kv_offload.disk_path)
    print(
        f"removed {files:,} files ({removed / (1 << 30):.2f} GiB) from "
        f"{config.kv_offload.disk_path}"
    )
    return 0
