"""The GPUs of a set of models (``plan.box``): each model's needs read from its plan alone
on one GPU, placed by ``plan.placement``, and the views the rest of the box plan works on
(a model's engine config split over its GPUs, a group's models on its GPUs alone)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GpuFacts, HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import make_plan
from vllm_offload.plan.placement import Placed, Placement, place, splits_for
from vllm_offload.plan.records import BoxInputs, Notes, Plan, PlanError, gib
from vllm_offload.plan.together import gpu_need


def place_models(inputs: BoxInputs) -> Placement:
    """Each model's GPUs: by hand (``gpus`` in its entry) or by the placement's rule."""
    host = inputs.host
    if len(host.gpus) <= 1 or inputs.platform != "cuda":
        return place({name: _unplaced() for name in inputs.engines}, host.gpus)
    largest = sorted(host.gpus, key=lambda g: (-g.total_bytes, g.index))
    models: dict[str, Placed] = {}
    for i, (name, engine) in enumerate(inputs.engines.items()):
        entry, facts = inputs.config.models[i], inputs.facts[name]
        asked = engine.parallel.tensor_parallel_size
        pinned = None if entry.gpus == "auto" else tuple(entry.gpus)
        splits = splits_for(facts.num_attention_heads, facts.num_kv_heads, len(host.gpus))
        if pinned is not None and len(pinned) not in splits:
            raise PlanError(
                f"models[{i}].gpus",
                f"'{name}': vLLM cannot split its {facts.num_attention_heads} attention "
                f"heads over {len(pinned)} GPUs: name {' or '.join(map(str, splits))} of them",
            )
        if asked > 1:  # [parallel] tensor_parallel_size set by hand: that split alone
            splits = (asked,)
        alone = _alone(inputs, name, engine, largest, splits[-1])
        models[name] = Placed(
            need_on=partial(_need_on, engine, facts, alone),
            splits=splits,
            utilization=engine.gpu.memory_utilization,
            pinned=pinned,
            index=i,
        )
    return place(models, host.gpus)


def split_alone(
    config: DeploymentConfig,
    facts: ModelFacts,
    host: HostFacts,
    planned: Callable[[DeploymentConfig], Plan],
) -> Plan:
    """One model on a host with several GPUs (``planned``: make_plan on this host): split
    by tensor parallelism over the fewest GPUs that hold its weights, where one GPU holds
    them only by offloading some to host RAM (weights_offload.cpu_gib 'auto') or not at all
    (0). Kept on one GPU where it fits there, where tensor or pipeline parallelism is
    configured, or where cpu_gib names an amount (offloading was asked for)."""
    parallel = config.parallel
    asked = config.weights_offload.cpu_gib
    pinned = parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1
    if len(host.gpus) <= 1 or pinned or asked not in ("auto", 0):
        return planned(config)
    try:
        one: Plan | None = planned(config)
    except PlanError as exc:
        one, refused = None, exc
    if one is not None and one.weights.offloaded_bytes == 0:
        return one
    for k in splits_for(facts.num_attention_heads, facts.num_kv_heads, len(host.gpus))[1:]:
        try:
            split = planned(_split(config, k))
        except PlanError:
            continue
        if split.weights.offloaded_bytes == 0:
            instead = (
                f"one would offload {gib(one.weights.offloaded_bytes)} of them to host RAM"
                if one is not None
                else "they fit no one GPU"
            )
            why = (
                f"placement: split over GPUs {','.join(str(g.index) for g in host.gpus[:k])} "
                f"(tensor parallel {k}): the weights ({gib(split.weights.bytes)}) fit {k} "
                f"GPUs; {instead} (weights_offload.cpu_gib = a number keeps it on one)"
            )
            return replace(split, notes=Notes(decisions=(why,)) + split.notes)
    if one is None:
        raise refused
    return one


def split_engines(
    engines: Mapping[str, DeploymentConfig], placement: Placement
) -> dict[str, DeploymentConfig]:
    """Each engine config with tensor parallelism over its GPUs (one GPU: as it was)."""
    return {
        name: _split(engine, len(placement.gpus[name])) if len(placement.gpus[name]) > 1 else engine
        for name, engine in engines.items()
    }


def gpu_host(host: HostFacts, gpus: tuple[int, ...]) -> HostFacts:
    """The host as an engine on ``gpus`` sees it (all of them where none are named)."""
    if not gpus:
        return host
    return replace(host, gpus=tuple(g for g in host.gpus if g.index in gpus))


def group_inputs(inputs: BoxInputs, group: tuple[str, ...], placement: Placement) -> BoxInputs:
    """The models of one group on their GPUs alone."""
    gpus = tuple(sorted({g for name in group for g in placement.gpus[name]}))
    return replace(
        inputs,
        engines={name: inputs.engines[name] for name in group},
        facts={name: inputs.facts[name] for name in group},
        disks={name: inputs.disks[name] for name in group},
        host=gpu_host(inputs.host, gpus),
    )


def _need_on(engine: DeploymentConfig, facts: ModelFacts, alone: Plan, k: int) -> int:
    return gpu_need(_split(engine, k), facts, alone)


def _split(engine: DeploymentConfig, k: int) -> DeploymentConfig:
    if engine.parallel.tensor_parallel_size == k:
        return engine
    parallel = engine.parallel.model_copy(update={"tensor_parallel_size": k})
    return engine.model_copy(update={"parallel": parallel})


def _alone(
    inputs: BoxInputs, name: str, engine: DeploymentConfig, largest: list[GpuFacts], splits: int
) -> Plan:
    """Its plan alone on the largest GPU, which its needs are read from (the KV layout and
    working memory: they do not depend on where the weights go): as configured, else with
    weights offloaded as needed, else split over the most GPUs vLLM splits it by."""
    offload = engine.weights_offload.model_copy(update={"cpu_gib": "auto"})
    tries = [
        (engine, 1),
        (engine.model_copy(update={"weights_offload": offload}), 1),
        (_split(engine, splits), splits),
    ]
    first: PlanError | None = None
    for config, count in tries:
        try:
            return make_plan(
                config,
                inputs.facts[name],
                gpu_host(inputs.host, _first(largest, count)),
                inputs.platform,
                env=inputs.env,
                disk=inputs.disks[name],
                vllm_release=inputs.vllm_release,
            )
        except PlanError as exc:
            first = first or exc
    assert first is not None
    raise first


def _first(gpus: list[GpuFacts], count: int) -> tuple[int, ...]:
    return tuple(g.index for g in gpus[:count])


def _unplaced() -> Placed:
    return Placed(need_on=lambda _k: 0, splits=(1,), utilization=1.0)
