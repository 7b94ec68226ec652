"""Several models on a box with several GPUs: which GPU(s) each model's engine runs on.

Each model is placed by what it needs on one GPU when planned alone (``together.gpu_need``:
its weights, vLLM's working memory and a KV pool for its length), largest first:

- on one GPU where it fits alone: a GPU no model has yet, else the one with the most room
  left (the largest empty one first); models that share a GPU switch on it, models on
  separate GPUs serve at once;
- split by tensor parallelism over the fewest GPUs that hold it (a size vLLM can split its
  attention heads by), the roomiest ones, where no one GPU holds it;
- on the largest GPU alone where no split holds it either (its plan then offloads weights or
  says why it cannot start).

``gpus = [...]`` in a [[models]] entry pins it by hand (tensor parallel over the list); the
models placed by the rule count the pinned ones' needs. Pure: needs and GPUs in, the
placement and its ``chose:`` lines out. One GPU (or none) places nothing and says nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from vllm_offload.hardware import GpuFacts
from vllm_offload.plan.records import Notes, gib

# A model's GPU bytes per card when split over k GPUs (k = 1: on one).
NeedOn = Callable[[int], int]


@dataclass(frozen=True, kw_only=True)
class Placed:
    """One model to place: its need per card over k GPUs, the split sizes its attention
    heads allow, the share of a card it may use (gpu.memory_utilization), and its pin."""

    need_on: NeedOn
    splits: tuple[int, ...]  # GPU counts it may take, ascending ([parallel]'s alone if set)
    utilization: float
    pinned: tuple[int, ...] | None = None  # [[models]] gpus, by hand
    index: int = 0  # its [[models]] entry, for messages


@dataclass(frozen=True, kw_only=True)
class Placement:
    gpus: dict[str, tuple[int, ...]]  # each model's GPU indexes, in the file's order
    notes: Notes

    def groups(self) -> list[tuple[str, ...]]:
        """Models that share GPUs, directly or through one another (each group switches on
        its own GPUs), in the file's order; on a host without GPUs, all of them."""
        found: list[tuple[set[int], list[str]]] = []
        for name, gpus in self.gpus.items():
            devices = set(gpus) or {-1}  # no GPU: they take turns on the CPU
            joined = [g for g in found if g[0] & devices]
            merged: tuple[set[int], list[str]] = (devices, [])
            for group in joined:
                found.remove(group)
                merged[0].update(group[0])
                merged[1].extend(group[1])
            merged[1].append(name)
            found.append(merged)
        order = list(self.gpus)
        return [tuple(sorted(names, key=order.index)) for _, names in found]


def splits_for(heads: int, kv_heads: int, gpu_count: int) -> tuple[int, ...]:
    """Tensor-parallel sizes up to ``gpu_count`` that vLLM splits such a model by: the
    attention heads divide evenly, and the KV heads do or are replicated evenly."""
    return tuple(
        k
        for k in range(1, gpu_count + 1)
        if heads % k == 0 and (kv_heads % k == 0 or k % kv_heads == 0)
    )


def place(models: Mapping[str, Placed], gpus: Sequence[GpuFacts]) -> Placement:
    """Each model's GPUs (pins are checked before: ``plan.box_gpus.check_pins``)."""
    if len(gpus) <= 1:
        only = tuple(g.index for g in gpus)
        return Placement(gpus={name: only for name in models}, notes=Notes())
    on: dict[int, list[str]] = {g.index: [] for g in gpus}  # the models placed on each
    load = {g.index: 0 for g in gpus}  # bytes needed on each, over the models placed there
    chosen: dict[str, tuple[int, ...]] = {}
    decisions: list[str] = []

    def put(name: str, where: tuple[int, ...]) -> None:
        chosen[name] = where
        for g in where:
            on[g].append(name)
            load[g] += models[name].need_on(len(where))

    for name, model in models.items():
        if model.pinned is not None:
            put(name, model.pinned)
            decisions.append(f"placement: '{name}' on {_named(model.pinned)} (models[].gpus)")
    auto = [n for n, m in models.items() if m.pinned is None]
    for name in sorted(auto, key=lambda n: -models[n].need_on(1)):
        model = models[name]
        usable = {g.index: int(g.total_bytes * model.utilization) for g in gpus}
        where, why = _choose(model, usable, load, on)
        put(name, where)
        decisions.append(f"placement: '{name}' on {_named(where)}: {why}")
    return Placement(gpus={n: chosen[n] for n in models}, notes=Notes(decisions=tuple(decisions)))


def _choose(
    model: Placed,
    usable: Mapping[int, int],
    load: Mapping[int, int],
    on: Mapping[int, list[str]],
) -> tuple[tuple[int, ...], str]:
    """The GPUs for one model and why (``load``, ``on``: the models placed so far)."""
    roomiest = sorted(usable, key=lambda g: (load[g] > 0, -(usable[g] - load[g]), g))
    configured = model.splits[0] if len(model.splits) == 1 and model.splits[0] > 1 else 0
    for k in model.splits:
        need = model.need_on(k)
        fits = [g for g in roomiest if need <= usable[g]]
        if len(fits) < k:
            continue
        picked = tuple(sorted(fits[:k]))
        beside = sorted({n for g in picked for n in on[g]})
        where = (
            f"beside {', '.join(repr(n) for n in beside)} (no GPU it fits is free)"
            if beside
            else "a GPU of its own"
            if k == 1
            else "GPUs of its own"
        )
        if k == 1:
            return picked, f"its {gib(need)} fits one GPU; {where}"
        if configured:
            return picked, f"over {k} as [parallel] asks ({gib(need)} on each); {where}"
        return picked, (
            f"its {gib(model.need_on(1))} fits no one GPU; split over {k} "
            f"(tensor parallel {k}: {gib(need)} on each); {where}"
        )
    count = configured or 1
    largest = tuple(sorted(sorted(usable, key=lambda g: (-usable[g], g))[:count]))
    return largest, (
        f"its {gib(model.need_on(count))} fits no GPU"
        + ("" if configured else f", nor a split over {model.splits[-1]}")
        + ": the largest; its plan offloads weights where weights_offload.cpu_gib lets it, "
        "else says why it cannot start"
    )


def _named(gpus: tuple[int, ...]) -> str:
    return f"GPU {gpus[0]}" if len(gpus) == 1 else "GPUs " + ",".join(map(str, gpus))
