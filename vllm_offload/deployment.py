"""One answer to "can this config start here, and how?".

``prepare`` reads the model directory, plans, reads the API key, builds the launch spec,
runs the pre-flight checks and looks at the patch state of the installed vLLM. `serve`,
`plan`, and the manager's preview, save and start all call it, so the page refuses
exactly what the command line refuses, with the same words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import demo_model, hardware, launch, model_facts, patching
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.launch import LaunchSpec, PreflightError
from vllm_offload.plan import Plan, PlanError, Platform, make_plan
from vllm_offload.vllm_version import SUPPORTED, InstalledVllm


@dataclass(frozen=True)
class Prepared:
    model_dir: Path
    plan: Plan
    spec: LaunchSpec
    problems: tuple[VllmOffloadError, ...]  # why it must not start; none: it may
    notes: tuple[str, ...]  # what the launcher chose, and why


def model_dir(config: DeploymentConfig) -> Path:
    """The configured model, or the built-in demo model (written on first use)."""
    if config.model.path:
        return Path(config.model.path).expanduser().absolute()
    return demo_model.ensure_default()


def plan_for(
    config: DeploymentConfig, directory: Path, host: HostFacts, environ: Mapping[str, str]
) -> Plan:
    """The plan of ``config`` with the model in ``directory`` on ``host``; raises
    ModelFactsError or PlanError, each naming the field."""
    platform: Platform = "cuda" if host.has_nvidia_gpu else "cpu"
    path = config.kv_offload.disk_path
    disk = hardware.probe_disk(path) if path else None
    return make_plan(config, model_facts.read(directory), host, platform, dict(environ), disk)


def prepare(
    config: DeploymentConfig,
    host: HostFacts,
    environ: Mapping[str, str],
    vllm: InstalledVllm | None,
    *,
    allow_unpatched: bool = False,
) -> Prepared:
    """Everything short of starting: raises what makes a plan impossible (a bad model
    directory, a config that cannot fit); lists in ``problems`` what forbids a start
    here and now. ``vllm`` None: none is installed here (a dry run on a laptop), so the
    spec is for the pinned release and the patch state is not checked."""
    directory = model_dir(config)
    plan = plan_for(config, directory, host, environ)
    problems: list[VllmOffloadError] = [PlanError(p["field"], p["message"]) for p in plan.problems]
    try:
        api_key = launch.read_api_key(config)
    except PreflightError as exc:
        problems.append(exc)
        api_key = None
    version = vllm.version if vllm is not None else SUPPORTED[0]
    spec = launch.build(config, plan, directory, version, api_key)
    problems += launch.preflight(plan)
    notes = list(spec.notes)
    if vllm is not None and (unpatched := patch_problem(vllm)) is not None:
        if allow_unpatched:
            notes.append(f"warning: {unpatched}; starting anyway (--allow-unpatched)")
        else:
            problems.append(PreflightError(
                "vllm",
                f"{unpatched}; run `vllm-offload patch apply` (make install does), or pass "
                "--allow-unpatched",
            ))  # fmt: skip
    return Prepared(directory, plan, spec, tuple(problems), tuple(notes))


def patch_problem(vllm: InstalledVllm) -> str | None:
    """Why the installed vLLM is not as vllm-offload's patches leave it, or None."""
    site = vllm.package_dir.parent
    try:
        state = patching.status(site)
    except patching.PatchError as exc:
        return str(exc)
    if state is not patching.State.APPLIED:
        return f"vLLM {vllm.version} at {site} is not patched by vllm-offload"
    return None
