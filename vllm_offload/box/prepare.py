"""``deployment.prepare`` for several models: each model's folder read (inside the model
roots), the set planned (``plan.box``), the machine checked once, and each engine's
launch spec built (its unix socket, sleep mode). `serve`, `plan` and the manager call it
for a config with two or more ``[[models]]``, as they call ``prepare`` for one."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import disk_facts, launch
from vllm_offload.config import ConfigError, DeploymentConfig
from vllm_offload.config.schema import engine_configs, entry_field
from vllm_offload.deployment import confined_model_dir, hub_not_downloaded, model_dtype
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.launch_spec import EngineLaunch, LaunchSpec, PreflightError
from vllm_offload.model import facts as model_facts
from vllm_offload.model.config_json import ModelFactsError
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import Platform
from vllm_offload.plan.box import BoxPlan, plan_box
from vllm_offload.plan.box_asleep import weights_on_gpu_bytes
from vllm_offload.plan.records import BoxInputs, PlanError
from vllm_offload.preflight import machine_checks
from vllm_offload.upstream.version import InstalledVllm, release_for
from vllm_offload.vllm_ext import plugin_missing

ENGINES_DIR = "engines"  # the engines' sockets and specs: the server's user alone
CONTROL_SOCKET = "control.sock"  # the front door's control routes, for the manager


@dataclass(frozen=True, kw_only=True)
class PreparedBox:
    plan: BoxPlan
    model_dirs: dict[str, Path]
    specs: dict[str, LaunchSpec]  # each engine's, by model name
    runtime_dir: Path
    api_key: str | None  # what the front door asks of clients; engines have none
    problems: tuple[VllmOffloadError, ...]
    notes: tuple[str, ...]


def several(config: DeploymentConfig) -> bool:
    """Whether ``config`` serves several models (a front door before their engines)."""
    return len(config.models) > 1


def single(config: DeploymentConfig) -> DeploymentConfig:
    """The one model's config: a lone [[models]] entry is served as [model] is, with no
    extra hop."""
    if len(config.models) == 1:
        if config.models[0].gpus != "auto":  # a lone model has no front door to place it
            raise ConfigError(
                "models[0].gpus",
                "places one model of several; for one model, set CUDA_VISIBLE_DEVICES in "
                "the server's environment (the unit's EnvironmentFile) to the GPUs it may use",
            )
        (only,) = engine_configs(config).values()
        return only
    return config


def runtime_dir(config: DeploymentConfig, environ: Mapping[str, str]) -> Path:
    """residency.runtime_dir, else systemd's RuntimeDirectory, else the user's."""
    if config.residency.runtime_dir:
        return Path(config.residency.runtime_dir)
    if environ.get("RUNTIME_DIRECTORY"):
        return Path(environ["RUNTIME_DIRECTORY"].split(":")[0])
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "vllm-offload"
    return Path.home() / ".cache" / "vllm-offload" / "run"


def prepare_box(
    config: DeploymentConfig,
    host: HostFacts,
    environ: Mapping[str, str],
    vllm: InstalledVllm | None,
    *,
    allow_unpatched: bool = False,
    roots: Sequence[Path] | None = None,
    from_hub: bool = False,
) -> PreparedBox:
    """Everything short of starting the set: raises what makes a plan impossible (naming
    the model's entry), lists in ``problems`` what forbids a start here and now.
    ``from_hub``: as ``deployment.prepare``'s, for each hub id."""
    engines, dirs, facts, not_pulled = read_models(config, roots, from_hub)
    platform: Platform = "cuda" if host.has_nvidia_gpu else "cpu"
    disks = {
        name: disk_facts.probe_disk(e.kv_offload.disk_path) if e.kv_offload.disk_path else None
        for name, e in engines.items()
    }
    box_plan = plan_box(
        BoxInputs(
            config=config,
            engines=engines,
            facts=facts,
            disks=disks,
            host=host,
            platform=platform,
            vllm_release=release_for(vllm, platform),
            env=dict(environ),
        )
    )
    problems = plan_problems(box_plan, environ) + not_pulled
    lmcache = any(m.plan.kv.backend == "lmcache" for m in box_plan.models.values())
    api_key, found, notes = machine_checks(config, lmcache, environ, vllm, allow_unpatched)
    problems += found
    run_dir = runtime_dir(config, environ)
    specs = {}
    for i, (name, model) in enumerate(box_plan.models.items()):
        socket = run_dir / ENGINES_DIR / f"{i}.sock"  # an index: sockets' paths are short
        engine = EngineLaunch(
            socket=str(socket),
            sleeps=model.idle == "sleep",
            keeps_copy=box_plan.keeps_copy,
            layered_wake=config.residency.layered_wake and config.residency.sleep_level == 1,
            # as asked, not as capped: the engine's allocations may be a little larger
            weights_on_gpu=weights_on_gpu_bytes(config) if model.weights_on_gpu_bytes else 0,
            gpus=model.gpus if len(host.gpus) > 1 else (),
        )
        specs[name] = launch.build(model.config, model.plan, dirs[name], engine=engine)
    return PreparedBox(
        plan=box_plan,
        model_dirs=dirs,
        specs=specs,
        runtime_dir=run_dir,
        api_key=api_key,
        problems=tuple(problems),
        notes=tuple(notes),
    )


def read_models(
    config: DeploymentConfig, roots: Sequence[Path] | None, from_hub: bool
) -> tuple[
    dict[str, DeploymentConfig], dict[str, Path], dict[str, ModelFacts], list[VllmOffloadError]
]:
    """Each engine's config (its dtype resolved), folder and facts, and why a model planned
    from the hub cannot start yet; raises what makes a model unreadable, naming its entry."""
    engines = engine_configs(config)
    dirs: dict[str, Path] = {}
    facts: dict[str, ModelFacts] = {}
    not_pulled: list[VllmOffloadError] = []
    for i, (name, config_i) in enumerate(engines.items()):
        try:  # errors name the entry (models[1].path, 'coder'), not the one-model key
            remote = hub_not_downloaded(config_i) if from_hub else None
            if remote is not None:  # planned from the hub; it cannot start before a pull
                facts[name], dirs[name] = remote[0], Path(remote[0].path)
                not_pulled.append(PreflightError(entry_field(i, "model.path"), remote[1]))
                continue
            dirs[name] = confined_model_dir(config_i, roots)
            engines[name] = model_dtype(config_i, dirs[name])
            facts[name] = model_facts.read(dirs[name])
        except (ConfigError, ModelFactsError) as exc:  # its kind kept: the hub down is exit 1
            raise exc.named(entry_field(i, exc.field), f"'{name}': {exc.message}") from None
    return engines, dirs, facts, not_pulled


def plan_problems(box_plan: BoxPlan, environ: Mapping[str, str]) -> list[VllmOffloadError]:
    """What the set's plan and each model's forbid, each model's named by its entry."""
    problems: list[VllmOffloadError] = [
        PlanError(p["field"], p["message"]) for p in box_plan.notes.problems
    ]
    for i, (name, model) in enumerate(box_plan.models.items()):
        for problem in model.plan.notes.problems:
            problems.append(
                PlanError(entry_field(i, problem["field"]), f"'{name}': {problem['message']}")
            )
    sleeps = any(m.idle == "sleep" for m in box_plan.models.values())
    missing = plugin_missing(environ) if sleeps else None
    if missing:  # vLLM's own sleep backend would run: more host RAM than planned
        why = f"models that sleep need our sleep backend, and {missing}"
        problems.append(PlanError("residency.idle", f"{why}; or set residency.idle = 'stop'"))
    return problems


def socket_of(prepared: PreparedBox, name: str) -> Path:
    return Path(str(prepared.specs[name].option("--uds")))


def control_socket(config: DeploymentConfig, environ: Mapping[str, str] = os.environ) -> Path:
    return runtime_dir(config, environ) / CONTROL_SOCKET
