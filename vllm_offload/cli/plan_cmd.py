"""`vllm-offload plan`: what fits where, before anything starts."""

from __future__ import annotations

import argparse
import json
import os

from vllm_offload import deployment
from vllm_offload.cli import _common
from vllm_offload.plan import render


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show what fits: weights, GPU KV pool, longest request, CPU tier",
        description="Resolve every 'auto' of the config against the model and this host "
        "(or a declared GPU) and print the plan.",
    )
    _common.add_config_options(parser)
    _common.add_host_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    host = _common.host_facts(args)
    plan = deployment.plan_for(config, deployment.model_dir(config), host, os.environ)
    print(json.dumps(plan.to_json(), indent=2) if args.json else render(plan))
    return 0
