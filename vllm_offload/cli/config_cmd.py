"""`vllm-offload config show`: the effective config, after file and flags."""

from __future__ import annotations

import argparse
import json

from vllm_offload import config as config_mod
from vllm_offload.cli import _common


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("config", help="inspect the deployment config")
    actions = parser.add_subparsers(dest="config_action", required=True, metavar="ACTION")
    show = actions.add_parser(
        "show", help="print the effective config (file, then flags) as TOML or JSON"
    )
    _common.add_config_options(show)
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    show.set_defaults(handler=show_config)


def show_config(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    if args.json:
        print(json.dumps(config.model_dump(), indent=2))
    else:
        print(config_mod.to_toml(config), end="")
    return 0
