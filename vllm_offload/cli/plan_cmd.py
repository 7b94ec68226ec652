"""`vllm-offload plan`: what fits where, before anything starts."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from vllm_offload import cluster_router, deployment
from vllm_offload.box.prepare import prepare_box, several, single
from vllm_offload.cli import _common
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.length_advice import short_for_chat
from vllm_offload.plan import PlanError, render
from vllm_offload.plan.box_render import box_json, render_box
from vllm_offload.upstream.version import InstalledVllm


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show what fits: weights, GPU KV pool, longest request, CPU tier",
        description="Resolve every 'auto' of the config against the model and this host "
        "(or a declared GPU) and print the plan, with a 'cannot start:' line for each reason "
        "`serve` would refuse it. Exit status: 0 when it can start, 2 when it cannot (the "
        "plan is printed either way), as `serve --dry-run`. On a declared machine "
        "(--gpu-mem-gib, --ram-gib) the vLLM installed here is not checked. With several "
        "[[models]]: each model's plan beside the others, then the set's. A Hugging Face "
        "repo id not downloaded yet is planned from the hub's config.json and safetensors "
        "headers (no weights fetched) and cannot start until `vllm-offload pull`. With "
        "[[cluster.boxes]]: which boxes serve each model, behind the router.",
    )
    _common.add_config_options(parser)
    _common.add_host_options(parser)
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    config = _common.effective_config(args, extra_args)
    # With [[cluster.boxes]]: which boxes serve each model (JSON: a "cluster" key).
    cluster = {"cluster": cluster_router.routes(config.cluster)} if config.cluster.boxes else {}
    status = _run(args, config, cluster)
    if cluster and not args.json:
        print(cluster_router.render_routes(config.cluster))
    return status


def _run(args: argparse.Namespace, config: DeploymentConfig, cluster: dict[str, Any]) -> int:
    host = _common.host_facts(args)
    vllm = None if _common.declared(args) else _common.installed_vllm(required=False)
    if several(config):
        box_plan = prepare_box(config, host, os.environ, vllm, from_hub=True)
        details = [problem.detail() for problem in box_plan.problems]
        if args.json:
            print(json.dumps({**box_json(box_plan.plan), "problems": details, **cluster}, indent=2))
        else:
            print(render_box(box_plan.plan))
            for problem in box_plan.problems:
                print(f"cannot start: {problem.field}: {problem.message}")
        return max((problem.exit_code for problem in box_plan.problems), default=0)
    return _single(args, single(config), cluster, host, vllm)


def _single(
    args: argparse.Namespace,
    config: DeploymentConfig,
    cluster: dict[str, Any],
    host: HostFacts,
    vllm: InstalledVllm | None,
) -> int:
    """One model's plan, and each reason it cannot start; where the planner refuses with a
    fix it can plan (PlanError.instead), the plan with that fix beside the refusal."""
    refused: list[PlanError] = []
    try:
        prepared = deployment.prepare(config, host, os.environ, vllm, from_hub=True)
    except PlanError as exc:
        # The plan with the fix the refusal names, beside it (issue #56: the commonest
        # refusals printed no plan, where the README promises one either way).
        if not exc.instead:
            raise
        fixed = with_overrides(config, exc.instead)
        try:
            prepared = deployment.prepare(fixed, host, os.environ, vllm, from_hub=True)
        except PlanError:
            raise exc from None
        refused.append(exc)
    plan = prepared.plan
    problems: list[VllmOffloadError] = [*refused, *prepared.problems]
    instead = {"planned_with": refused[0].instead} if refused else {}
    if args.json:
        shown = [problem.detail() for problem in problems]
        print(json.dumps({**plan.to_json(), "problems": shown, **instead, **cluster}, indent=2))
    else:
        print(render(plan))
        planned = {(p["field"], p["message"]) for p in plan.notes.problems}
        for problem in problems:  # the plan's own are in its table already
            if (problem.field, problem.message) not in planned:
                print(f"cannot start: {problem.field}: {problem.message}")
        if refused:
            said = ", ".join(f"{k} = {v!r}" for k, v in instead["planned_with"].items())
            print(f"(the plan above is the one with {said}, the first fix it names)")
        elif advice := short_for_chat(config, plan, prepared.model_dir, host, os.environ):
            print(f"warning: {advice}")
    return max((problem.exit_code for problem in problems), default=0)
