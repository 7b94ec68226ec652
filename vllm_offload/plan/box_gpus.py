"""The GPUs of a set of models (``plan.box``): each model's needs read from its plan alone
on one GPU, placed by ``plan.placement``, and the views the rest of the box plan works on
(a model's engine config split over its GPUs, a group's models on its GPUs alone)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

from vllm_offload import hardware
from vllm_offload.config import DeploymentConfig
from vllm_offload.config.schema import entry_field
from vllm_offload.hardware import GpuFacts, HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan import make_plan
from vllm_offload.plan.placement import Placed, Placement, place, splits_for
from vllm_offload.plan.records import BoxInputs, Notes, Plan, PlanError, gib
from vllm_offload.plan.together import gpu_need


def place_models(inputs: BoxInputs) -> Placement:
    """Each model's GPUs: by hand (``gpus`` in its entry) or by the placement's rule. Where
    CUDA_VISIBLE_DEVICES names GPUs another way than by index, nothing is placed: every
    engine gets the GPUs it names, in turns (NVML's indexes could widen it)."""
    host = inputs.host
    check_pins(inputs)
    if len(host.gpus) > 1 and not placeable(inputs.env):
        why = (
            "placement: none; CUDA_VISIBLE_DEVICES names GPUs by UUID or MIG instance "
            "(name them by index to place models on them): the models take turns on them"
        )
        return Placement(gpus={n: () for n in inputs.engines}, notes=Notes(decisions=(why,)))
    if len(host.gpus) <= 1 or inputs.platform != "cuda":
        return place({name: _unplaced() for name in inputs.engines}, host.gpus)
    largest = sorted(host.gpus, key=lambda g: (-g.total_bytes, g.index))
    models: dict[str, Placed] = {}
    for i, (name, engine) in enumerate(inputs.engines.items()):
        entry, facts = inputs.config.models[i], inputs.facts[name]
        world = engine.parallel.ranks
        splits = (
            (world,)
            if world > 1
            else splits_for(facts.num_attention_heads, facts.num_kv_heads, len(host.gpus))
        )
        alone = _alone(inputs, i, name, engine, largest, world if world > 1 else splits[-1])
        models[name] = Placed(
            need_on=partial(_need_on, engine, facts, alone),
            splits=splits,
            utilization=engine.gpu.memory_utilization,
            pinned=None if entry.gpus == "auto" else tuple(entry.gpus),
            index=i,
        )
    return place(models, host.gpus)


def check_pins(inputs: BoxInputs) -> None:
    """Every ``gpus`` pin names GPUs here, as many as its model takes: raises PlanError
    naming the entry. Also [parallel] asking for more GPUs than the box has."""
    indexes = sorted(g.index for g in inputs.host.gpus)
    for i, (name, engine) in enumerate(inputs.engines.items()):
        entry, facts, world = inputs.config.models[i], inputs.facts[name], engine.parallel.ranks
        if world > max(1, len(indexes)) and inputs.platform == "cuda":
            raise PlanError(
                "parallel.tensor_parallel_size",
                f"'{name}': [parallel] asks for {world} GPUs (tensor x pipeline parallel) "
                f"and this box has {len(indexes)}",
            )
        if entry.gpus == "auto":
            continue
        field, pinned = f"models[{i}].gpus", entry.gpus
        missing = [g for g in pinned if g not in indexes]
        if missing:
            here = f"GPUs {indexes}" if indexes else "no NVIDIA GPU"
            raise PlanError(field, f"'{name}': GPU {missing[0]} is not here ({here}): name those")
        if world > 1 and len(pinned) != world:
            raise PlanError(
                field,
                f"'{name}': [parallel] asks for {world} GPUs (tensor x pipeline parallel): "
                f"name {world}, or leave parallel at 1 and let the list set the split",
            )
        splits = splits_for(facts.num_attention_heads, facts.num_kv_heads, len(pinned))
        if world == 1 and len(pinned) not in splits:
            raise PlanError(
                field,
                f"'{name}': vLLM cannot split its {facts.num_attention_heads} attention heads "
                f"over {len(pinned)} GPUs: name {' or '.join(map(str, splits))} of them",
            )


def placeable(env: Mapping[str, str]) -> bool:
    """Whether GPUs may be placed by NVML index: CUDA_VISIBLE_DEVICES unset or indexes."""
    named = env.get("CUDA_VISIBLE_DEVICES")
    return named is None or hardware.visible_indexes(named) is not None


def split_alone(
    config: DeploymentConfig,
    facts: ModelFacts,
    host: HostFacts,
    env: Mapping[str, str],
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
    if len(host.gpus) <= 1 or pinned or asked not in ("auto", 0) or not placeable(env):
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
    """Each engine config with tensor parallelism over its GPUs where [parallel] left it
    at one GPU (one GPU, or the split [parallel] asks for: as it was)."""
    return {
        name: _split(engine, len(placement.gpus[name]))
        if len(placement.gpus[name]) > 1 and engine.parallel.ranks == 1
        else engine
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
    return gpu_need(engine if k == engine.parallel.ranks else _split(engine, k), facts, alone)


def _split(engine: DeploymentConfig, k: int) -> DeploymentConfig:
    if engine.parallel.tensor_parallel_size == k:
        return engine
    parallel = engine.parallel.model_copy(update={"tensor_parallel_size": k})
    return engine.model_copy(update={"parallel": parallel})


def _alone(
    inputs: BoxInputs,
    index: int,
    name: str,
    engine: DeploymentConfig,
    largest: list[GpuFacts],
    most: int,
) -> Plan:
    """Its plan alone on the largest GPU, which its needs are read from (the KV layout and
    working memory: they do not depend on where the weights go): as configured, else with
    weights offloaded as needed, else over ``most`` GPUs ([parallel]'s count where set;
    else the most vLLM splits it by). Raises the first refusal, naming its entry."""
    offload = engine.weights_offload.model_copy(update={"cpu_gib": "auto"})
    world = engine.parallel.ranks
    tries = [
        (engine, world),
        (engine.model_copy(update={"weights_offload": offload}), world),
        (engine if world > 1 else _split(engine, most), most),
    ]
    first: PlanError | None = None
    for config, count in tries:
        try:
            host = gpu_host(inputs.host, _first(largest, count))
            return plan_model(inputs, index, name, config, host)
        except PlanError as exc:  # named for its entry by plan_model
            first = first or exc
    assert first is not None
    raise first


def _first(gpus: list[GpuFacts], count: int) -> tuple[int, ...]:
    return tuple(g.index for g in gpus[:count])


def _unplaced() -> Placed:
    return Placed(need_on=lambda _k: 0, splits=(1,), utilization=1.0)


def plan_model(
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
