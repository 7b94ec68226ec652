"""``weights_offload.params`` against the model's components (issue #46): each pattern must
take parameters vLLM's offloader sees (``model_parts`` says which names those are), and
the offload the plan counts must fit in what the patterns take."""

from __future__ import annotations

from typing import Any

from vllm_offload.config import DeploymentConfig
from vllm_offload.model.facts import ModelFacts
from vllm_offload.model.parts import Component, matching
from vllm_offload.plan.records import Notes, PlanInputs, Problem, gib

FIELD = "weights_offload.params"


def component_rows(model: ModelFacts) -> tuple[dict[str, Any], ...]:
    """The components as the plan's JSON lists them."""
    return tuple({"name": p.name, "kind": p.kind, "bytes": p.bytes} for p in model.components)


def listing(parts: list[Component] | tuple[Component, ...]) -> str:
    """Components in words: 'visual (vision tower, 1.26 GiB), ...'."""
    return ", ".join(f"{p.name!r} ({p.kind}, {gib(p.bytes)})" for p in parts)


def _refusal(pattern: str, model: ModelFacts, prefetch: bool) -> str:
    towers = [p for p in model.components if p.kind != "language model" and p.matches(pattern)]
    if prefetch and towers:
        return (
            f"{pattern!r} names {listing(towers)}, which the prefetch backend never offloads "
            "(vLLM's PrefetchOffloader wraps decoder layers only); set weights_offload.backend "
            f"= 'uva' to offload it, or name parts of a decoder layer"
        )
    layer = next((p for p in model.components if p.kind == "language model"), None)
    names = layer.param_names if layer else ()
    examples = ", ".join(repr(n) for n in sorted({name.split(".")[0] for name in names}))
    return (
        f"{pattern!r} matches no parameter vLLM offloads in {model.architecture}, so nothing "
        f"would be; its components are {listing(model.components)}. A tower is matched by its "
        "module name (e.g. the first one above); a decoder layer by names inside the layer, "
        f"as vLLM names them ({examples or 'mlp, self_attn'}, or longer names such as "
        "'mlp.down_proj'; not 'language_model', 'layers' nor 'q_proj', which vLLM fuses into "
        "'qkv_proj'); fix or remove the pattern"
    )


def _offloadable(config: DeploymentConfig, model: ModelFacts) -> list[Component]:
    """The components the configured backend offloads from (prefetch: decoder layers only)."""
    prefetch = config.weights_offload.backend == "prefetch"
    return [p for p in model.components if not prefetch or p.kind == "language model"]


def offload_notes(inputs: PlanInputs, offloaded_bytes: int, served_bytes: int) -> Notes:
    """What weights_offload.params takes and refuses, and which components an offload
    without patterns takes first."""
    return (
        offload_param_checks(inputs)
        + offload_room_check(inputs, offloaded_bytes, served_bytes)
        + tower_first_note(inputs, offloaded_bytes)
    )


def offload_param_checks(inputs: PlanInputs) -> Notes:
    """Each pattern of weights_offload.params refused when it takes nothing vLLM would
    offload, and what each takes, as a decision."""
    config, model = inputs.config, inputs.model
    params = config.weights_offload.params
    if not params or not model.components:
        return Notes()
    prefetch = config.weights_offload.backend == "prefetch"
    offloadable = _offloadable(config, model)
    problems: list[Problem] = []
    decisions: list[str] = []
    for pattern in params:
        taken = matching(pattern, offloadable)
        if taken:
            decisions.append(f"{FIELD} {pattern!r} takes parameters of {listing(taken)}")
        else:
            problems.append({"field": FIELD, "message": _refusal(pattern, model, prefetch)})
    return Notes(decisions=tuple(decisions), problems=tuple(problems))


def language_only(model: ModelFacts) -> list[str]:
    """Patterns that take decoder-layer parameters and no tower's (the first part of each
    layer name, where no tower has it: Qwen2.5-VL's towers have MLPs too)."""
    towers = [p for p in model.components if p.kind != "language model"]
    layer = next((p for p in model.components if p.kind == "language model"), None)
    firsts = sorted({name.split(".")[0] for name in (layer.param_names if layer else ())})
    return [first for first in firsts if not matching(first, towers)]


def tower_first_note(inputs: PlanInputs, offloaded_bytes: int) -> Notes:
    """With no patterns, vLLM's UVA offloader fills cpu_gib in construction order, and a
    multi-part model builds its towers before its language model (models/interfaces.py
    _mark_tower_model wraps them as they are built): the towers go first."""
    config, model = inputs.config, inputs.model
    towers = [p for p in model.components if p.kind != "language model"]
    uva = config.weights_offload.backend == "uva"
    if config.weights_offload.params or not offloaded_bytes or not towers or not uva:
        return Notes()
    only = ", ".join(repr(name) for name in language_only(model))
    theirs = min(offloaded_bytes, sum(p.bytes for p in towers))
    return Notes(
        decisions=(
            f"weights offload: with {FIELD} empty vLLM offloads the towers first (built "
            f"before the language model; {listing(towers)}): {gib(theirs)} of the "
            f"{gib(offloaded_bytes)} are theirs, so image requests read them over the host "
            f"link; to keep them on the GPU name decoder-layer parts only "
            f"({only or 'none here takes no tower parameter'})",
        )
    )


def offload_room_check(inputs: PlanInputs, offloaded_bytes: int, served_bytes: int) -> Notes:
    """Refuses an offload larger than the components the patterns take (per rank, at the
    served dtype): vLLM would offload less and the pool the plan counts would not exist."""
    config, model = inputs.config, inputs.model
    params = config.weights_offload.params
    if not params or not offloaded_bytes or not model.components:
        return Notes()
    offloadable = _offloadable(config, model)
    taken = {p.name: p for pattern in params for p in matching(pattern, offloadable)}
    ranks = config.parallel.ranks
    scale = served_bytes / max(1, model.weight_bytes)
    room = int(sum(p.bytes for p in taken.values()) * scale) // ranks
    if not taken or offloaded_bytes <= room:
        return Notes()
    return Notes.problem(
        "weights_offload.cpu_gib",
        f"the plan offloads {gib(offloaded_bytes)} per GPU but {FIELD} takes at most "
        f"{gib(room)} ({listing(list(taken.values()))}), so vLLM would offload less and the KV "
        f"pool would be smaller than planned; lower weights_offload.cpu_gib to at most "
        f"{room / (1 << 30):.2f} or widen {FIELD}",
    )
