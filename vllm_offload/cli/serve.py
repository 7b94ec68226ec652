"""`vllm-offload serve`: plan, check, then become vLLM's OpenAI server."""

from __future__ import annotations

import argparse
import json
import os
import sys

from vllm_offload import launch, patching
from vllm_offload.cli import _common
from vllm_offload.plan import render
from vllm_offload.vllm_version import SUPPORTED, InstalledVllm, VllmNotFound, find


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI API with vLLM, the CPU KV tier configured from the plan",
        description="Plan the deployment, run the pre-flight checks, print the plan, then "
        "run vLLM's OpenAI server in this process. Arguments after `--` go to vLLM as they "
        "are.",
    )
    _common.add_config_options(parser)
    _common.add_host_options(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact command line and the KVTransferConfig JSON, run the "
        "pre-flight checks and exit with their result (0 or 2); start nothing",
    )
    parser.add_argument(
        "--allow-unpatched",
        action="store_true",
        help="start even if vllm-offload's patches are not applied to vLLM (warns)",
    )
    parser.set_defaults(handler=run)


def _installed_vllm(dry_run: bool) -> InstalledVllm | None:
    try:
        return find()
    except VllmNotFound:
        if dry_run:
            return None
        raise


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    directory = _common.model_dir(config)
    host = _common.host_facts(args)
    plan = _common.plan_for(config, directory, host, dict(os.environ))
    vllm = _installed_vllm(args.dry_run)
    api_key = launch.read_api_key(config)
    # Without vLLM here (a dry run on a laptop), plan for the pinned release.
    version = vllm.version if vllm is not None else SUPPORTED[0]
    spec = launch.build(config, plan, directory, version, api_key)
    print(render(plan), file=sys.stderr)
    for note in spec.notes:
        _common.say(note)
    errors = launch.preflight(plan)
    if vllm is not None:
        problem = _patch_problem(vllm)
        if problem is not None and args.allow_unpatched:
            _common.warn(f"{problem}; starting anyway (--allow-unpatched)")
        elif problem is not None:
            errors.append(
                launch.PreflightError(
                    "vllm",
                    f"{problem}; run `vllm-offload patch "
                    "apply` (make install does), or pass "
                    "--allow-unpatched",
                )
            )
    if args.dry_run:
        print(spec.printable())
        print(json.dumps(spec.kv_transfer_config, indent=2))
        if spec.kv_transfer_config is not None and vllm is not None:
            errors += _validation_errors(spec)
    if errors:
        for error in errors:
            print(f"vllm-offload: error: {error}", file=sys.stderr)
        return 2
    if args.dry_run:
        return 0
    launch.run(spec)
    return 0


def _patch_problem(vllm: InstalledVllm) -> str | None:
    site = vllm.package_dir.parent
    try:
        state = patching.status(site)
    except patching.PatchError as exc:
        return str(exc)
    if state is not patching.State.APPLIED:
        return f"vLLM {vllm.version} at {site} is not patched by vllm-offload"
    return None


def _validation_errors(spec: launch.LaunchSpec) -> list[launch.PreflightError]:
    try:
        launch.validate_with_vllm(spec)
    except launch.PreflightError as exc:
        return [exc]
    return []
