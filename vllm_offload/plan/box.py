"""Several models on one box: each model planned as its engine runs when on the GPU, and the
GPU memory and host RAM of the whole set (the RAM's arithmetic: ``plan.box_host``).

Models asleep keep their engines: each holds some GPU memory (CUDA context, workspaces,
graphs' pool) and, at level 1, its weights in host RAM; so the model on the GPU gets the
GPU less what the sleepers hold, and every engine's RAM (its own processes, offloaded
weights, host extension, CPU tier, and a sleeper's weights) must fit the host at once.
Stopped models hold nothing. Each model is planned by ``make_plan`` on a view of the host
that has what the others hold taken out, so one set of rules decides every model; the
CPU tiers left 'auto' share what the set leaves, equally.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from vllm_offload.config import DeploymentConfig
from vllm_offload.config.schema import entry_field
from vllm_offload.hardware import GIB, GpuFacts, HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import make_plan
from vllm_offload.plan.box_gpus import gpu_host, group_inputs, place_models, split_engines
from vllm_offload.plan.box_host import Away, Idle, holds, holds_serving, host_view, tier_shares
from vllm_offload.plan.records import BoxInputs, Notes, Plan, PlanError, Platform, gib
from vllm_offload.plan.together import resident_models

# GPU memory an engine asleep still holds (H200, Llama-3-8B shape, CUDA graphs, issue #31):
# 1.53 GiB at levels 1 and 2 in the final runs, 2.48 GiB in the first try
# (benchmarks/results/h200-vllm-0.32.0/switch/); planned with room to spare.
ASLEEP_GPU_BYTES = 3 * GIB
# The model on the GPU must keep at least this share of it.
MIN_GPU_SHARE = 0.05
# residency.min_resident_s 'auto', by what a switch costs (H200, vLLM 0.33.0, two 8B
# models, issue #43; docs/several-models.md, benchmarks/results/h200-vllm-0.33.0/turns/).
# Level-1 sleep (a switch 0.5 s to first token): no turns served 1 and 4 people per model
# best (most requests, lowest mean and p95 first token). Level 2 (2.35 s) or 'stop' (a
# minute or more): 5 s turns, which cut the switches 7 times at one person per model.
TURN_FAST_SWITCH_S = 0.0
TURN_SLOW_SWITCH_S = 5.0


@dataclass(frozen=True, kw_only=True)
class ModelPlan:
    name: str
    config: DeploymentConfig  # what its engine runs (its GPU share as the set leaves it)
    model: ModelFacts
    plan: Plan
    idle: Idle
    away_ram_bytes: int  # host RAM it holds while away (engine, weights, tier); 0: stopped
    serving_ram_bytes: int  # host RAM it holds on the GPU (with its sleep copy, if kept)
    gpus: tuple[int, ...] = ()  # the GPU indexes its engine runs on (plan.placement)
    resident_beside: int = 1  # models of its GPUs' group on them at once ('auto' resolved)
    switches: bool = True  # its group has more models than its GPUs hold at once


@dataclass(frozen=True, kw_only=True)
class BoxPlan:
    models: dict[str, ModelPlan]  # in the file's order
    default: str
    max_resident: int  # models on one GPU at once ('auto' resolved; the most of any group)
    min_resident_s: float  # a model's turn ('auto' resolved)
    keeps_copy: bool  # a model on the GPU keeps its sleep copy (residency.host_copy)
    notes: Notes
    cards: tuple[GpuFacts, ...] = ()  # the box's GPUs where it has several (plan.placement)


def idle_mode(
    config: DeploymentConfig, platform: Platform, all_resident: bool = False
) -> tuple[Idle, Notes]:
    idle = config.residency.idle
    if idle == "auto" and all_resident:
        return "stop", Notes(
            decisions=(
                "residency.idle auto -> stop: every model stays on the GPU, so none sleeps (no "
                "engine keeps a host copy of its weights); one put away by hand stops",
            )
        )
    if idle == "auto":
        chosen: Idle = "sleep" if platform == "cuda" else "stop"
        why = "vLLM's sleep mode on an NVIDIA GPU" if chosen == "sleep" else "no NVIDIA GPU"
        return chosen, Notes(decisions=(f"residency.idle auto -> {chosen}: {why}",))
    if idle == "sleep" and platform != "cuda":
        return "stop", Notes.problem(
            "residency.idle",
            "vLLM's sleep mode needs an NVIDIA GPU; set residency.idle = 'stop' (or 'auto')",
        )
    return idle, Notes()


def host_copy(config: DeploymentConfig, idle: Idle) -> tuple[bool, Notes]:
    """Whether a model on the GPU keeps its level-1 sleep copy of the weights
    (residency.host_copy), and what giving it back costs and saves."""
    if config.residency.host_copy == "keep" or idle != "sleep" or config.residency.sleep_level != 1:
        return True, Notes()
    return False, Notes(
        decisions=(
            "residency.host_copy = release: a model on the GPU gives its host copy of the "
            "weights back after each wake, so it holds that much less host RAM while it "
            "serves, and each put-away copies the weights out again (a slower switch); the "
            "set's peak is the same (at a switch the model put away copies its weights out "
            "while the one coming in still holds its copy), so no more models fit",
        )
    )


def turn_s(config: DeploymentConfig, idle: Idle, switches: bool) -> tuple[float, Notes]:
    """residency.min_resident_s, 'auto' resolved by what a switch costs (H200 figures);
    said where models switch (not where every one stays on the GPU)."""
    asked = config.residency.min_resident_s
    if asked != "auto":
        return asked, Notes()
    fast = idle == "sleep" and config.residency.sleep_level == 1
    if fast:
        why = (
            "level-1 sleep: a switch is the weights' copy (0.5 s for an 8B model on an "
            "H200, where no turns served people best at every load measured; a larger "
            "model or a slower link: set seconds)"
        )
    elif idle == "sleep":
        why = (
            "level-2 sleep: a switch reads the weights again (2.35 s for an 8B model on an "
            "H200); turns keep the box from switching for each request"
        )
    else:
        why = (
            "stop: a switch restarts the engine (a minute or more); turns keep the box "
            "from switching for each request"
        )
    chosen = TURN_FAST_SWITCH_S if fast else TURN_SLOW_SWITCH_S
    line = f"residency.min_resident_s auto -> {chosen:g}: {why} (docs/several-models.md)"
    return chosen, Notes(decisions=(line,) if switches else ())


def _gpu_share(
    name: str, config: DeploymentConfig, host: HostFacts, sleepers: int
) -> tuple[DeploymentConfig, Notes]:
    """``config`` with the GPU share the sleepers leave it: vLLM's memory_utilization is a
    share of the whole GPU, and its start checks that much is free."""
    if not sleepers or not host.gpus:
        return config, Notes()
    total = min(g.total_bytes for g in host.gpus)
    asked = config.gpu.memory_utilization
    share = asked - sleepers * ASLEEP_GPU_BYTES / total
    if share < MIN_GPU_SHARE:
        return config, Notes.problem(
            "residency.idle",
            f"'{name}' would keep {share:.0%} of the GPU beside "
            f"{sleepers} models asleep ({gib(ASLEEP_GPU_BYTES)} each): fewer models, "
            "residency.idle = 'stop', or a larger GPU",
        )
    gpu = config.gpu.model_copy(update={"memory_utilization": round(share, 4)})
    return config.model_copy(update={"gpu": gpu}), Notes(
        decisions=(
            f"'{name}': gpu.memory_utilization {asked:g} -> {share:.4f}: leaves "
            f"{gib(sleepers * ASLEEP_GPU_BYTES)} for the {sleepers} other model(s) asleep",
        )
    )


def plan_box(inputs: BoxInputs) -> BoxPlan:
    """Plan every model of the set; raises PlanError naming the model's entry for what no
    setting makes fit, lists in the notes' problems what forbids a start. Models are placed
    on the GPUs first (``plan.placement``); each group of models that share GPUs then gets
    its resident count and GPU shares on its own GPUs, and the host's RAM counts them all."""
    config, host = inputs.config, inputs.host
    placement = place_models(inputs)
    inputs = replace(inputs, engines=split_engines(inputs.engines, placement))
    engines = inputs.engines
    notes = placement.notes
    shares: dict[str, DeploymentConfig] = {}
    resident_of: dict[str, int] = {}
    sleeping: dict[str, int] = {}
    idle: Idle = "stop"
    groups = placement.groups()
    all_resident = True
    for group in groups:
        view = group_inputs(inputs, group, placement)
        resident, group_shares, said = _resident(view) if len(group) > 1 else (1, {}, Notes())
        all_resident = all_resident and resident >= len(group)
        shares.update(group_shares)
        notes += said
        resident_of.update({name: resident for name in group})
    idle, step = idle_mode(config, inputs.platform, all_resident)
    turn, said = turn_s(config, idle, switches=not all_resident)
    notes = step + notes + said
    level = config.residency.sleep_level
    for group in groups:
        view = group_inputs(inputs, group, placement)
        resident = resident_of[group[0]]
        sleepers = len(group) - resident if idle == "sleep" else 0
        sleeping.update({name: sleepers for name in group})
        if not any(name in shares for name in group):  # as configured: less the sleepers'
            for name in group:
                shares[name], step = _gpu_share(name, engines[name], view.host, sleepers)
                notes += step
        notes += _resident_shares_fit(resident, {n: shares[n] for n in group}, view.host, sleepers)
    hosts = {name: gpu_host(host, placement.gpus[name]) for name in engines}
    alone = {
        name: _plan(inputs, i, name, shares[name], hosts[name]) for i, name in enumerate(engines)
    }
    # Engines alive at once: every one when they sleep or where groups serve side by side;
    # else max_resident of them (counted as all, which only errs on the safe side).
    together = idle == "sleep" or len(groups) > 1 or resident_of[next(iter(engines))] > 1
    away = Away(idle=idle, level=level, together=together)
    keeps, step = host_copy(config, idle)
    notes += step
    tiers, step = tier_shares(alone, shares, host, away)
    notes += step + _disk_tiers_apart(shares)
    if idle == "sleep":
        notes += _no_extension_asleep(alone)
    planned: dict[str, ModelPlan] = {}
    for i, name in enumerate(engines):
        engine = shares[name]
        if name in tiers:  # an 'auto' tier: the set's equal share, as a number
            update = {"cpu_tier_gib": tiers[name] / GIB}
            engine = engine.model_copy(
                update={"kv_offload": engine.kv_offload.model_copy(update=update)}
            )
        seen = host_view(hosts[name], name, alone, tiers, away)
        plan = _plan(inputs, i, name, engine, seen)
        held = holds(plan, idle, level) + plan.cpu_tier.bytes if idle == "sleep" else 0
        planned[name] = ModelPlan(
            name=name,
            config=engine,
            model=inputs.facts[name],
            plan=plan,
            idle=idle,
            away_ram_bytes=held,
            serving_ram_bytes=holds_serving(plan, idle, level, keeps) + plan.cpu_tier.bytes,
            gpus=placement.gpus[name],
            resident_beside=resident_of[name],
            switches=any(name in g and len(g) > resident_of[name] for g in groups),
        )
    default = config.residency.default_model or next(iter(engines))
    return BoxPlan(
        models=planned,
        default=default,
        max_resident=max(resident_of.values()),
        min_resident_s=turn,
        keeps_copy=keeps,
        notes=notes,
        cards=host.gpus if len(host.gpus) > 1 else (),
    )


def _resident(inputs: BoxInputs) -> tuple[int, dict[str, DeploymentConfig], Notes]:
    """max_resident as configured (no shares set here), or 'auto' (plan.together): the
    count, and each model's config with its share when several stay together."""
    engines = inputs.engines
    asked = inputs.config.residency.max_resident
    if asked != "auto":
        return min(asked, len(engines)), {}, Notes()
    alone = {
        name: _plan(inputs, i, name, engine, inputs.host)
        for i, (name, engine) in enumerate(engines.items())
    }
    count, shares, notes = resident_models(inputs, alone, ASLEEP_GPU_BYTES)
    configs = {}
    for name, share in shares.items():
        gpu = engines[name].gpu.model_copy(update={"memory_utilization": share})
        configs[name] = engines[name].model_copy(update={"gpu": gpu})
    return count, configs, notes


def _plan(
    inputs: BoxInputs, index: int, name: str, config: DeploymentConfig, host: HostFacts
) -> Plan:
    """Model ``name`` planned with ``config`` (its share of the set) on ``host`` (as the
    others leave it)."""
    model, disk = inputs.facts[name], inputs.disks[name]
    try:
        return make_plan(
            config,
            model,
            host,
            inputs.platform,
            env=inputs.env,
            disk=disk,
            vllm_release=inputs.vllm_release,
        )
    except PlanError as exc:
        raise PlanError(entry_field(index, exc.field), f"'{name}': {exc.message}") from None


def _resident_shares_fit(
    resident: int, shares: Mapping[str, DeploymentConfig], host: HostFacts, sleepers: int
) -> Notes:
    """Above one resident model, the largest shares of the GPU must fit it together."""
    if resident == 1 or len(shares) == 1 or not host.gpus:
        return Notes()
    total = min(g.total_bytes for g in host.gpus)
    largest = sorted((c.gpu.memory_utilization for c in shares.values()), reverse=True)
    together = sum(largest[:resident]) + sleepers * ASLEEP_GPU_BYTES / total
    if together <= 1.0:
        return Notes()
    return Notes.problem(
        "residency.max_resident",
        f"{resident} models on the GPU at once "
        f"take {together:.0%} of it (their gpu.memory_utilization shares"
        + (f" and {sleepers} asleep" if sleepers else "")
        + "): give each "
        "model its share ([models.gpu] memory_utilization), or lower "
        "max_resident",
    )


def _no_extension_asleep(alone: Mapping[str, Plan]) -> Notes:
    """Patch 0006 refuses the host extension with sleep mode (its host blocks are mapped
    outside vLLM's sleeping allocator)."""
    notes = Notes()
    for i, (name, plan) in enumerate(alone.items()):
        if plan.extension.bytes:
            notes += Notes.problem(
                f"models[{i}].kv_offload.host_extension_gib",
                f"'{name}': the KV pool's host extension cannot sleep (vLLM with patch 0006 "
                "refuses it with sleep mode): set it to 0 for this model, or "
                "residency.idle = 'stop'",
            )
    return notes


def _disk_tiers_apart(configs: Mapping[str, DeploymentConfig]) -> Notes:
    """A disk tier serves one engine (it holds the tier's lock)."""
    seen: dict[str, str] = {}
    for name, config in configs.items():
        path = config.kv_offload.disk_path
        if path and path in seen:
            return Notes.problem(
                "kv_offload.disk_path",
                f"'{seen[path]}' and '{name}' would share the disk tier at {path}, which "
                "serves one engine: give each model its own ([models.kv_offload] disk_path)",
            )
        seen[path] = name
    return Notes()
