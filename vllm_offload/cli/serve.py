"""`vllm-offload serve`: plan, check, then become vLLM's OpenAI server."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence

from vllm_offload import deployment, launch_spec, run_vllm
from vllm_offload.box.prepare import prepare_box, several, single
from vllm_offload.cli import _common
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.model import hub
from vllm_offload.plan import render
from vllm_offload.plan.box_render import render_box
from vllm_offload.upstream.version import InstalledVllm


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the OpenAI API with vLLM, the CPU KV tier configured from the plan",
        description="Plan the deployment, run the pre-flight checks, print the plan, then "
        "run vLLM's OpenAI server in this process. With several [[models]], this process "
        "is their front door (one OpenAI port, routed by the request's model) and each "
        "model's vLLM server its child. Arguments after `--` go to vLLM as they are.",
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
        "--pull",
        action="store_true",
        help="fetch the configured Hugging Face models first (as `vllm-offload pull`); "
        "without it a hub id must be downloaded already",
    )
    parser.add_argument(
        "--allow-unpatched",
        action="store_true",
        help="start even if vllm-offload's patches are not applied to vLLM (warns)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    host = _common.host_facts(args)
    vllm = _common.installed_vllm(required=not args.dry_run)
    if args.pull:
        for ref in deployment.hub_models(config):
            print(f"pulled {ref} into {hub.pull(ref)}", file=sys.stderr)
    if several(config):
        return run_box(args, config, host, vllm)
    config = single(config)
    prepared = deployment.prepare(
        config, host, os.environ, vllm, allow_unpatched=args.allow_unpatched
    )
    print(render(prepared.plan), file=sys.stderr)
    refused = _checked(args, config, vllm, prepared.notes, prepared.problems, {"": prepared.spec})
    if refused is not None:
        return refused
    run_vllm.run(prepared.spec)
    return 0


def run_box(
    args: argparse.Namespace, config: DeploymentConfig, host: HostFacts, vllm: InstalledVllm | None
) -> int:
    """Several models: plan the set, then serve their front door (engines as children)."""
    import asyncio

    from vllm_offload.box.runner import serve_box

    prepared = prepare_box(config, host, os.environ, vllm, allow_unpatched=args.allow_unpatched)
    print(render_box(prepared.plan), file=sys.stderr)
    refused = _checked(args, config, vllm, prepared.notes, prepared.problems, prepared.specs)
    if refused is not None:
        return refused
    return asyncio.run(serve_box(prepared, config))


def _checked(
    args: argparse.Namespace,
    config: DeploymentConfig,
    vllm: InstalledVllm | None,
    notes: Sequence[str],
    problems: Sequence[VllmOffloadError],
    specs: Mapping[str, launch_spec.LaunchSpec],
) -> int | None:
    """Say the notes and (with --dry-run) each command line; the exit code when a problem,
    the dry run or a taken port ends it here, None to start."""
    for note in notes:
        _common.say(note)
    found = list(problems)
    if args.dry_run:
        for name, spec in specs.items():
            print(f"# {name}\n{spec.printable()}" if name else spec.printable())
            if spec.kv_transfer_config is not None:  # none without a CPU tier (not 'null')
                print(json.dumps(spec.kv_transfer_config, indent=2))
            if vllm is not None:  # vLLM's own classes and parser read what would start
                found += _validation_errors(spec)
    if found:
        for problem in found:
            print(f"vllm-offload: error: {problem}", file=sys.stderr)
        return max(problem.exit_code for problem in found)
    if args.dry_run:
        return 0
    # Here, not in deployment.prepare: the manager prepares a restart while the running
    # server still holds the port.
    if (busy := _common.port_taken(config.server.host, config.server.port)) is not None:
        error = launch_spec.PreflightError("server.port", busy)
        print(f"vllm-offload: error: {error}", file=sys.stderr)
        return error.exit_code
    return None


def _validation_errors(spec: launch_spec.LaunchSpec) -> list[VllmOffloadError]:
    try:
        run_vllm.validate(spec)
    except launch_spec.PreflightError as exc:
        return [exc]
    return []
