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
from vllm_offload.hardware import GIB, GpuFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.box_asleep import (
    deep_sleep,
    host_copy_less,
    weights_on_gpu_bytes,
    weights_on_gpu_notes,
)
from vllm_offload.plan.box_gpus import gpu_host, place_models, plan_model, split_engines
from vllm_offload.plan.box_groups import host_copy, resolve_groups
from vllm_offload.plan.box_host import (
    ASLEEP_GPU_BYTES,
    Away,
    Idle,
    holds_serving,
    host_view,
    tier_shares,
)
from vllm_offload.plan.box_start import fixed_pool_shares, start_batches
from vllm_offload.plan.records import BoxInputs, Notes, Plan


@dataclass(frozen=True, kw_only=True)
class ModelPlan:
    name: str
    config: DeploymentConfig  # what its engine runs (its GPU share as the set leaves it)
    model: ModelFacts
    plan: Plan
    idle: Idle
    away_ram_bytes: int  # host RAM it holds while away (engine, weights, tier); 0: stopped
    away_gpu_bytes: int  # GPU memory it keeps while away (asleep, not checkpointed)
    weights_on_gpu_bytes: int = 0  # of those, its weights' (at most: whole allocations)
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
    deep_sleep: bool = False  # a model asleep is checkpointed off the GPU (residency.deep_sleep)
    cards: tuple[GpuFacts, ...] = ()  # the box's GPUs where it has several (plan.placement)
    # The models start-up brings in and puts to sleep once, in batches that start side by
    # side (plan.box_start), the default last.
    start_batches: tuple[tuple[str, ...], ...] = ()


def plan_box(inputs: BoxInputs) -> BoxPlan:
    """Plan every model of the set; raises PlanError naming the model's entry for what no
    setting makes fit, lists in the notes' problems what forbids a start. Models are placed
    on the GPUs first (``plan.placement``); each group of models that share GPUs then gets
    its resident count and GPU shares on its own GPUs (``_groups``), and the host's RAM
    counts every engine of the box."""
    config, host = inputs.config, inputs.host
    placement = place_models(inputs)
    inputs = replace(inputs, engines=split_engines(inputs.engines, placement))
    engines = inputs.engines
    sets = resolve_groups(inputs, placement)
    notes = placement.notes + sets.notes
    level = config.residency.sleep_level
    hosts = {name: gpu_host(host, placement.gpus[name]) for name in engines}
    alone = {
        name: plan_model(inputs, i, name, sets.shares[name], hosts[name])
        for i, name in enumerate(engines)
    }
    groups = placement.groups()
    switching = [
        n for g in groups if len(g) > sets.resident[g[0]] for n in g if sets.idle_of[n] == "sleep"
    ]
    sizes = {n: min((g.total_bytes for g in hosts[n].gpus), default=0) for n in engines}
    lowered, step = fixed_pool_shares(switching, sets.shares, inputs.facts, alone, sizes)
    shares = {**sets.shares, **lowered}
    notes += step
    # Engines alive at once: every one when they sleep or where groups serve side by side;
    # else max_resident of them (counted as all, which only errs on the safe side).
    together = sets.idle == "sleep" or len(groups) > 1 or max(sets.resident.values()) > 1
    idle_of = {n: i for n, i in sets.idle_of.items() if i != sets.idle}
    split = [n for n, p in alone.items() if p.tensor_parallel_size > 1 and n in switching]
    deep, step = deep_sleep(config, sets.idle, host, split)
    notes += step + weights_on_gpu_notes(config, sets.idle)
    on_gpu = weights_on_gpu_bytes(config)
    less = {n: host_copy_less(on_gpu, shares[n], inputs.facts[n], p) for n, p in alone.items()}
    away = Away(
        idle=sets.idle, level=level, together=together, idle_of=idle_of, deep=deep, copy_less=less
    )
    keeps, step = host_copy(config, sets.idle)
    notes += step
    tiers, step = tier_shares(alone, shares, host, away)
    notes += step + _disk_tiers_apart(shares)
    notes += _no_extension_asleep({n: p for n, p in alone.items() if away.of(n) == "sleep"})
    planned: dict[str, ModelPlan] = {}
    for i, name in enumerate(engines):
        engine, idle = _with_tier(shares[name], tiers.get(name)), away.of(name)
        seen = host_view(hosts[name], name, alone, tiers, away)
        plan = plan_model(inputs, i, name, engine, seen)
        held = away.held(plan, name) + plan.cpu_tier.bytes if idle == "sleep" else 0
        kept = idle == "sleep" and plan.platform == "cuda" and not deep
        weights_kept = min(on_gpu, plan.weights.gpu_bytes) if kept else 0
        planned[name] = ModelPlan(
            name=name,
            config=engine,
            model=inputs.facts[name],
            plan=plan,
            idle=idle,
            away_ram_bytes=held,
            away_gpu_bytes=ASLEEP_GPU_BYTES + weights_kept if kept else 0,
            weights_on_gpu_bytes=weights_kept,
            serving_ram_bytes=holds_serving(plan, idle, level, keeps, less[name])
            + plan.cpu_tier.bytes,
            gpus=placement.gpus[name],
            resident_beside=sets.resident[name],
            switches=any(name in g and len(g) > sets.resident[name] for g in groups),
        )
    default = config.residency.default_model or next(iter(engines))
    return BoxPlan(
        models=planned,
        default=default,
        start_batches=_start_batches(config, default, switching, planned, host.gpus),
        max_resident=max(sets.resident.values()),
        min_resident_s=sets.turn_s,
        keeps_copy=keeps,
        notes=notes,
        deep_sleep=deep,
        cards=host.gpus if len(host.gpus) > 1 else (),
    )


def _with_tier(engine: DeploymentConfig, tier: int | None) -> DeploymentConfig:
    """``engine`` with its 'auto' CPU tier (``tier``: the set's equal share) as a number."""
    if tier is None:
        return engine
    update = {"cpu_tier_gib": tier / GIB}
    return engine.model_copy(update={"kv_offload": engine.kv_offload.model_copy(update=update)})


def _start_batches(
    config: DeploymentConfig,
    default: str,
    switching: list[str],
    planned: Mapping[str, ModelPlan],
    cards: tuple[GpuFacts, ...],
) -> tuple[tuple[str, ...], ...]:
    """The models start-up brings in and puts to sleep (those that switch: the others from
    the file's last, the default last), in batches that start side by side."""
    first_sleeps = [n for n in reversed(list(planned)) if n != default and n in switching]
    first_sleeps += [default] if default in switching else []
    return start_batches(
        first_sleeps,
        {n: m.plan.gpu.budget_bytes for n, m in planned.items()},
        {n: m.gpus for n, m in planned.items()},
        cards,
        config.gpu.memory_utilization,
        {n: m.away_gpu_bytes for n, m in planned.items()},
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
