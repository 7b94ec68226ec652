"""One answer to "can this config start here, and how?".

``prepare`` reads the model directory, plans, reads the API key, builds the launch spec
and runs the pre-flight checks (``preflight``: the key's file, LMCache, the patch state of
the installed vLLM). `serve`, `plan`, and the manager's preview, save and start all call
it, so the page refuses exactly what the command line refuses, with the same words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import disk_facts, launch
from vllm_offload.config import ConfigError, DeploymentConfig, with_overrides
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.launch_spec import LaunchSpec, PreflightError
from vllm_offload.model import facts as model_facts
from vllm_offload.model import hub
from vllm_offload.model import real as real_model
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import Plan, PlanError, Platform, make_plan
from vllm_offload.plan.box_gpus import split_alone
from vllm_offload.preflight import machine_checks
from vllm_offload.upstream.version import InstalledVllm, release_for


@dataclass(frozen=True, kw_only=True)
class Prepared:
    model_dir: Path
    plan: Plan
    spec: LaunchSpec
    problems: tuple[VllmOffloadError, ...]  # why it must not start; none: it may
    notes: tuple[str, ...]  # what the launcher chose, and why


def model_dir(config: DeploymentConfig) -> Path:
    """The configured model folder resolved once (``~`` expanded, relative to the working
    directory, every link followed): what the model roots are checked against and what
    vLLM is given. A hub id: its download in the HF cache (never fetched here). Else the
    default model (SmolLM2-135M-Instruct, converted on first use)."""
    if config.model.path and (ref := hub.hub_ref(config.model.path)) is not None:
        return hub.downloaded(ref)
    if config.model.path:
        return Path(os.path.realpath(os.path.expanduser(config.model.path)))
    return real_model.ensure_default()


def hub_models(config: DeploymentConfig) -> list[hub.HubRef]:
    """The hub ids among the configured models ([model] or [[models]])."""
    paths = [entry.path for entry in config.models] or [config.model.path]
    return [ref for path in paths if path and (ref := hub.hub_ref(path)) is not None]


def model_roots(config: DeploymentConfig) -> list[Path]:
    """manager.model_roots resolved; empty: each configured model's parent directory
    ([model]'s, or every [[models]] entry's; none for a hub id: the HF cache is not a
    folder of models to list)."""
    if config.manager.model_roots:
        return [Path(os.path.realpath(root)) for root in config.manager.model_roots]
    entries = [entry.path for entry in config.models] or [config.model.path]
    parents: dict[Path, None] = {}
    for path in entries:
        if not (path and hub.hub_ref(path)):
            one = config.model_copy(
                update={"model": config.model.model_copy(update={"path": path}), "models": []}
            )
            parents[model_dir(one).parent] = None
    return list(parents)


def list_models(config: DeploymentConfig) -> list[dict[str, str]]:
    """The model folders (with a config.json) directly under the model roots; a name with a
    control character (a newline forged log lines) is not offered (the config refuses it)."""
    found = []
    for root in model_roots(config):
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if (child / "config.json").is_file() and child.name.isprintable():
                found.append({"name": child.name, "path": str(child)})
    return found


def check_inside(directory: Path, roots: Sequence[Path]) -> None:
    """Refuse (422, model.path) a resolved model folder outside the resolved roots."""
    if not any(directory == root or root in directory.parents for root in roots):
        raise ConfigError(
            "model.path",
            f"{directory} is outside the model roots ({', '.join(map(str, roots))}); add its "
            "directory to manager.model_roots",
        )


def confined_model_dir(config: DeploymentConfig, roots: Sequence[Path] | None) -> Path:
    """The model's folder, refused (422, model.path) outside ``roots`` (default:
    manager.model_roots, where set)."""
    directory = model_dir(config)
    if roots is None and config.manager.model_roots:
        roots = model_roots(config)
    # A hub id is confined by the fence instead: only the config file can name one.
    if roots is not None and config.model.path and not hub_models(config):
        check_inside(directory, roots)
    return directory


def hub_not_downloaded(config: DeploymentConfig) -> tuple[ModelFacts, str] | None:
    """A hub id not in the HF cache: its facts read from the hub (config.json and the
    safetensors headers, no weights) and why it cannot start yet; else None."""
    refs = hub_models(config)
    if not refs or hub.cached(refs[0]) is not None:
        return None
    facts, size = hub.remote_facts(refs[0])
    return facts, (
        f"{refs[0]} is not downloaded yet (planned from the hub's config.json and "
        f"safetensors headers); `vllm-offload pull {refs[0]}` fetches "
        f"{size / 2**30:.2f} GiB into {hub.cache_dir()}"
    )


def plan_for(
    config: DeploymentConfig,
    directory: Path,
    host: HostFacts,
    environ: Mapping[str, str],
    facts: ModelFacts | None = None,
    vllm: InstalledVllm | None = None,
) -> Plan:
    """The plan of ``config`` with the model in ``directory`` (or of ``facts`` read
    elsewhere) on ``host``, for ``vllm`` (none installed: the platform's pinned release);
    raises ModelFactsError or PlanError, each naming the field."""
    platform: Platform = "cuda" if host.has_nvidia_gpu else "cpu"
    path = config.kv_offload.disk_path
    disk = disk_facts.probe_disk(path) if path else None
    model = facts or model_facts.read(directory)
    release = release_for(vllm, platform)

    def planned(config: DeploymentConfig) -> Plan:
        return make_plan(
            config, model, host, platform, env=dict(environ), disk=disk, vllm_release=release
        )

    return split_alone(config, model, host, environ, planned)


def prepare(
    config: DeploymentConfig,
    host: HostFacts,
    environ: Mapping[str, str],
    vllm: InstalledVllm | None,
    *,
    allow_unpatched: bool = False,
    roots: Sequence[Path] | None = None,
    from_hub: bool = False,
) -> Prepared:
    """Everything short of starting: raises what makes a plan impossible (a bad model
    directory, one outside ``roots`` (default: manager.model_roots, where set), a config
    that cannot fit); lists in ``problems`` what forbids a start here and now. ``vllm``
    None: none is installed here (a dry run on a laptop), so the spec is for the pinned
    release and the patch state is not checked. ``from_hub``: a hub id not downloaded yet
    is planned from the hub (a problem: it cannot start before `pull`). The default model
    runs in real_model.DTYPE unless model.dtype says otherwise (model_dtype)."""
    remote = hub_not_downloaded(config) if from_hub else None
    if remote is not None:
        directory = Path(str(hub_models(config)[0]))
        plan = plan_for(config, directory, host, environ, remote[0], vllm)
    else:
        directory = confined_model_dir(config, roots)
        config = model_dtype(config, directory)
        plan = plan_for(config, directory, host, environ, vllm=vllm)
    problems: list[VllmOffloadError] = [
        PlanError(p["field"], p["message"]) for p in plan.notes.problems
    ]
    if remote is not None:
        problems.append(PreflightError("model.path", remote[1]))
    api_key, found, notes = machine_checks(
        config, plan.kv.backend == "lmcache", environ, vllm, allow_unpatched
    )
    spec = launch.build(config, plan, directory, api_key=api_key)
    problems += found
    return Prepared(
        model_dir=directory,
        plan=plan,
        spec=spec,
        problems=tuple(problems),
        notes=(*spec.notes, *notes),
    )


def model_dtype(config: DeploymentConfig, directory: Path) -> DeploymentConfig:
    """``config`` with the dtype its model needs where model.dtype is 'auto': the default
    model's real_model.DTYPE, however it is named (none, its path, a [[models]] entry)."""
    if config.model.dtype == "auto" and real_model.is_default_model(directory):
        return with_overrides(config, {"model.dtype": real_model.DTYPE})
    return config
