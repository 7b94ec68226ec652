"""Each group of models that share GPUs (``plan.box``), on its GPUs alone: how many of
its models stay on them at once (``max_resident``, 'auto': ``plan.together``), each model's
GPU share less what the models asleep beside it keep, what a model away is (asleep or
stopped: ``residency.idle``), whether a model on the GPU keeps its sleep copy, and the
turn a model gets (``residency.min_resident_s``); what a model asleep keeps on the GPU:
``plan.box_asleep``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import HostFacts
from vllm_offload.plan.box_asleep import asleep_gpu_bytes, largest_weights
from vllm_offload.plan.box_gpus import group_inputs, plan_model
from vllm_offload.plan.box_host import Idle
from vllm_offload.plan.placement import Placement
from vllm_offload.plan.records import BoxInputs, Notes, Platform, gib
from vllm_offload.plan.together import resident_models

# The model on the GPU must keep at least this share of it.
MIN_GPU_SHARE = 0.05
# residency.min_resident_s 'auto', by what a switch costs (H200, vLLM 0.33.0, two 8B
# models, issue #43; docs/several-models.md, benchmarks/results/h200-vllm-0.33.0/turns/).
# Level-1 sleep (a switch 0.5 s to first token): no turns served 1 and 4 people per model
# best (most requests, lowest mean and p95 first token). Level 2 (2.35 s) or 'stop' (a
# minute or more): 5 s turns, which cut the switches 7 times at one person per model.
TURN_FAST_SWITCH_S = 0.0
TURN_SLOW_SWITCH_S = 5.0


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
            "while the one coming in still holds its copy), so no more models fit; a "
            "switch of an 8B model on an H200 took 6.5-8.6 s instead of 0.5 "
            "(docs/several-models.md)",
        )
    )


def turn_s(config: DeploymentConfig, idle: Idle, switches: bool) -> tuple[float, Notes]:
    """residency.min_resident_s, 'auto' resolved by what a switch costs (H200 figures);
    said where models switch (not where every one stays on the GPU)."""
    asked = config.residency.min_resident_s
    if asked != "auto":
        return asked, Notes()
    level_1 = idle == "sleep" and config.residency.sleep_level == 1
    deep = idle == "sleep" and config.residency.deep_sleep
    fast = level_1 and config.residency.host_copy == "keep" and not deep
    if deep:
        why = (
            "deep sleep: each switch also checkpoints the model put away and restores the "
            "one brought in (an 8B model's switch 3.5 s instead of 0.55 on an H100); "
            "turns keep the box from switching for each request"
        )
    elif fast:
        why = (
            "level-1 sleep: a switch is the weights' copy (0.5 s for an 8B model on an "
            "H200, where no turns served people best at every load measured; a larger "
            "model or a slower link: set seconds)"
        )
    elif level_1:
        why = (
            "residency.host_copy = release: each put-away copies the weights out again "
            "(a switch 6.5-8.6 s for an 8B model on an H200); turns keep the box from "
            "switching for each request"
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
    name: str, config: DeploymentConfig, host: HostFacts, sleepers: int, asleep: int
) -> tuple[DeploymentConfig, Notes]:
    """``config`` with the GPU share the sleepers (``asleep`` bytes each) leave it: vLLM's
    memory_utilization is a share of the whole GPU, and its start checks that much is
    free."""
    if not sleepers or not asleep or not host.gpus:
        return config, Notes()
    total = min(g.total_bytes for g in host.gpus)
    asked = config.gpu.memory_utilization
    share = asked - sleepers * asleep / total
    if share < MIN_GPU_SHARE:
        return config, Notes.problem(
            "residency.idle",
            f"'{name}' would keep {share:.0%} of the GPU beside "
            f"{sleepers} models asleep ({gib(asleep)} each): fewer models, "
            "residency.deep_sleep = true, residency.idle = 'stop', or a larger GPU",
        )
    gpu = config.gpu.model_copy(update={"memory_utilization": round(share, 4)})
    return config.model_copy(update={"gpu": gpu}), Notes(
        decisions=(
            f"'{name}': gpu.memory_utilization {asked:g} -> {share:.4f}: leaves "
            f"{gib(sleepers * asleep)} for the {sleepers} other model(s) asleep",
        )
    )


@dataclass(frozen=True, kw_only=True)
class GroupSets:
    """What the groups of models sharing GPUs resolved: each model's resident count, its
    config with its GPU share, its idle; the switching models' idle and turn."""

    resident: dict[str, int]
    shares: dict[str, DeploymentConfig]
    idle_of: dict[str, Idle]
    idle: Idle
    turn_s: float
    notes: Notes


def resolve_groups(inputs: BoxInputs, placement: Placement) -> GroupSets:
    """Each group of models that share GPUs on its GPUs alone: how many stay on them at
    once, and each model's GPU share less what the models asleep on its GPUs keep. A group
    whose models all stay resident never switches: its models stop when put away by hand
    (with idle 'auto'), and need no sleep copy."""
    config, engines = inputs.config, inputs.engines
    groups = placement.groups()
    resident: dict[str, int] = {}
    shares: dict[str, DeploymentConfig] = {}
    notes = Notes()
    for group in groups:
        view = group_inputs(inputs, group, placement)
        count, set_shares, said = _resident(view) if len(group) > 1 else (1, {}, Notes())
        shares.update(set_shares)
        notes += said
        resident.update({name: count for name in group})
    settled = [g for g in groups if len(g) <= resident[g[0]]]
    switching = len(settled) < len(groups)
    idle, step = idle_mode(config, inputs.platform, all_resident=not switching)
    turn, said = turn_s(config, idle, switches=switching)
    notes = step + notes + said
    idle_of = {name: idle for name in engines}
    if switching and config.residency.idle == "auto":
        for group in settled:
            idle_of.update({name: "stop" for name in group})
            listed = ", ".join(f"'{n}'" for n in group)
            notes += Notes(
                decisions=(
                    f"residency.idle auto -> stop for {listed}: on GPUs of their own, never "
                    "switched (no sleep copy of the weights); one put away by hand stops",
                )
            )
    for group in groups:
        view = group_inputs(inputs, group, placement)
        count = resident[group[0]]
        sleepers = {n: _sleepers(n, group, count, placement) for n in group}
        if idle_of[group[0]] != "sleep":
            sleepers = dict.fromkeys(group, 0)
        weights = largest_weights({n: engines[n] for n in group}, inputs.facts)
        each = asleep_gpu_bytes(config, weights)
        if not any(name in shares for name in group):  # as configured: less the sleepers'
            for name in group:
                shares[name], step = _gpu_share(
                    name, engines[name], view.host, sleepers[name], each
                )
                notes += step
        group_shares = {n: shares[n] for n in group}
        asleep = max(sleepers.values()) * each
        notes += _resident_shares_fit(count, group_shares, view.host, asleep)
    return GroupSets(
        resident=resident, shares=shares, idle_of=idle_of, idle=idle, turn_s=turn, notes=notes
    )


def _sleepers(name: str, group: tuple[str, ...], resident: int, placement: Placement) -> int:
    """Models asleep beside ``name`` on the most crowded of its GPUs (its group's, on a
    host whose GPUs are not placed)."""
    mine = placement.gpus[name]
    if not mine:
        return len(group) - resident
    on = [sum(g in placement.gpus[n] for n in group) for g in mine]
    return max(0, max(on) - resident)


def _resident(inputs: BoxInputs) -> tuple[int, dict[str, DeploymentConfig], Notes]:
    """max_resident as configured (no shares set here), or 'auto' (plan.together): the
    count, and each model's config with its share when several stay together."""
    engines = inputs.engines
    asked = inputs.config.residency.max_resident
    if asked != "auto":
        return min(asked, len(engines)), {}, Notes()
    alone = {
        name: plan_model(inputs, i, name, engine, inputs.host)
        for i, (name, engine) in enumerate(engines.items())
    }
    asleep = asleep_gpu_bytes(inputs.config, largest_weights(engines, inputs.facts))
    count, shares, notes = resident_models(inputs, alone, asleep)
    configs = {}
    for name, share in shares.items():
        gpu = engines[name].gpu.model_copy(update={"memory_utilization": share})
        configs[name] = engines[name].model_copy(update={"gpu": gpu})
    return count, configs, notes


def _resident_shares_fit(
    resident: int, shares: Mapping[str, DeploymentConfig], host: HostFacts, asleep: int
) -> Notes:
    """Above one resident model, the largest shares of the GPU must fit it together, beside
    ``asleep`` bytes of the models asleep."""
    if resident == 1 or len(shares) == 1 or not host.gpus:
        return Notes()
    total = min(g.total_bytes for g in host.gpus)
    largest = sorted((c.gpu.memory_utilization for c in shares.values()), reverse=True)
    together = sum(largest[:resident]) + asleep / total
    if together <= 1.0:
        return Notes()
    return Notes.problem(
        "residency.max_resident",
        f"{resident} models on the GPU at once "
        f"take {together:.0%} of it (their gpu.memory_utilization shares"
        + (f" and {gib(asleep)} for models asleep" if asleep else "")
        + "): give each "
        "model its share ([models.gpu] memory_utilization), or lower "
        "max_resident",
    )
