"""A set of models' plan as `plan` prints it and as JSON (`plan --json`, the manager): each
model's plan, then the set's GPUs, decisions and problems."""

from __future__ import annotations

from vllm_offload.hardware import GpuFacts
from vllm_offload.plan import plan_json, render
from vllm_offload.plan.box import BoxPlan
from vllm_offload.plan.records import gib


def render_box(box_plan: BoxPlan) -> str:
    """Each model's plan as `plan` prints one, then the set's decisions and problems."""
    parts = []
    for name, model in box_plan.models.items():
        away = "asleep when away" if model.idle == "sleep" else "stopped when away"
        if model.idle == "sleep" and box_plan.deep_sleep:
            away += " (checkpointed off the GPU)"
        if model.away_ram_bytes:
            away += f", holding {gib(model.away_ram_bytes)} of host RAM"
        if model.weights_on_gpu_bytes:
            away += f" and up to {gib(model.weights_on_gpu_bytes)} of its weights on the GPU"
        default = ", the default" if name == box_plan.default else ""
        where = f", on {_gpus_named(model.gpus)}" if box_plan.cards else ""
        parts.append(f"== model '{name}' ({away}{default}{where})\n{render(model.plan)}")
    lines = [_card_line(card, box_plan) for card in box_plan.cards]
    lines += [f"chose: {d}" for d in box_plan.notes.decisions]
    lines += [f"warning: {w}" for w in box_plan.notes.warnings]
    lines += [f"cannot start: {p['field']}: {p['message']}" for p in box_plan.notes.problems]
    return "\n\n".join(parts) + ("\n\n== the set\n" + "\n".join(lines) if lines else "")


def _gpus_named(gpus: tuple[int, ...]) -> str:
    return f"GPU {gpus[0]}" if len(gpus) == 1 else "GPUs " + ",".join(map(str, gpus))


def _card_line(card: GpuFacts, box_plan: BoxPlan) -> str:
    """One GPU of several: its size and the models on it, together or in turns."""
    on = [m for m in box_plan.models.values() if card.index in m.gpus]
    names = ", ".join(f"'{m.name}'" for m in on) or "no model"
    at_once = min((m.resident_beside for m in on), default=0)
    how = "" if len(on) <= at_once else f" ({at_once} at a time)"
    return f"GPU {card.index} ({card.name}, {gib(card.total_bytes)}): {names}{how}"


def box_json(box_plan: BoxPlan) -> dict[str, object]:
    models = {
        name: {
            **plan_json(m.plan),
            "idle": m.idle,
            "away_ram_bytes": m.away_ram_bytes,
            "away_gpu_bytes": m.away_gpu_bytes,
            "weights_on_gpu_bytes": m.weights_on_gpu_bytes,
            "serving_ram_bytes": m.serving_ram_bytes,
            "gpus": list(m.gpus),
            "resident_beside": m.resident_beside,
        }
        for name, m in box_plan.models.items()
    }
    return {
        "models": models,
        "default": box_plan.default,
        "max_resident": box_plan.max_resident,
        "min_resident_s": box_plan.min_resident_s,
        "host_copy": "keep" if box_plan.keeps_copy else "release",
        "deep_sleep": box_plan.deep_sleep,
        "gpus": [
            {"index": c.index, "name": c.name, "total_bytes": c.total_bytes} for c in box_plan.cards
        ],
        "decisions": list(box_plan.notes.decisions),
        "warnings": list(box_plan.notes.warnings),
        "problems": list(box_plan.notes.problems),
    }
