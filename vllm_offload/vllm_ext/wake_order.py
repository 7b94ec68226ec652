"""The order of a layered wake (issue #58), pure: which of a model's weight allocations
come back first, and which copy each attention layer's step must wait for.

A level-1 wake copies the weights back from the host arena (vllm_ext/sleep.py), one
allocation of vLLM's weight pool at a time; a layered wake copies them in the order the
first forward needs them and lets that forward start at once, each layer waiting on the
GPU only for the copies it reads (vllm_ext/layered_wake.py). An allocation holds several
tensors (61 allocations for an 8B model's 195): it is ranked by the lowest layer among
them (``layers.N.`` in the tensor's name), so that layer N's copies hold all of its
tensors. Tensors outside the layers come first (the embedding, and anything unknown),
except the final norm and ``lm_head``, which come last; an allocation with no known tensor
comes first. Nothing here imports torch or vLLM: tested on any host.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_LAYER = re.compile(r"^(.*?)layers\.(\d+)\.")
_HEAD = re.compile(r"(?:^|\.)lm_head\.")
FIRST = -1  # the rank of what the first layer's step needs before its own tensors


@dataclass(frozen=True)
class Layers:
    """The decoder's attention layers: the part of their names before ``layers.N.``
    (``model.`` for Llama; a vision tower's ``layers.N`` elsewhere is not theirs) and each
    layer's N by name."""

    prefix: str
    by_name: dict[str, int]

    @property
    def last(self) -> int:
        return max(self.by_name.values())


def attention_layers(names: Iterable[str]) -> Layers | None:
    """The attention layers, or None where the layered wake does not know the model's
    order: a layer without ``layers.N.``, two of one N, or two prefixes."""
    prefixes: set[str] = set()
    by_name: dict[str, int] = {}
    for name in names:
        found = _LAYER.match(name)
        if found is None or int(found.group(2)) in by_name.values():
            return None
        prefixes.add(found.group(1))
        by_name[name] = int(found.group(2))
    return Layers(prefixes.pop(), by_name) if len(prefixes) == 1 else None


def tensor_rank(name: str, layers: Layers) -> int:
    """When the forward first reads this tensor: its decoder layer, FIRST before the
    layers (the embedding, and anything not known), the last layer + 1 after them (the
    decoder's final norm, lm_head)."""
    found = _LAYER.match(name)
    if found is not None and found.group(1) == layers.prefix:
        return int(found.group(2))
    if name.startswith(layers.prefix + "norm.") or _HEAD.search(name):
        return layers.last + 1
    return FIRST


@dataclass(frozen=True)
class CopyGroup:
    """Allocations copied together, before the event of ``rank`` is recorded."""

    rank: int
    allocations: tuple[int, ...]  # indexes into the allocations given


def copy_groups(
    allocations: Sequence[tuple[int, int]],
    tensors: Iterable[tuple[str, int]],
    layers: Layers,
) -> list[CopyGroup]:
    """``allocations``: (address, size) of the weight pool's allocations; ``tensors``:
    (name, data address) of the model's parameters and buffers. Groups in rank order,
    each allocation in exactly one."""
    starts = sorted(range(len(allocations)), key=lambda index: allocations[index][0])
    addresses = [allocations[index][0] for index in starts]
    ranks: dict[int, int] = {}
    for name, address in tensors:
        at = bisect.bisect_right(addresses, address) - 1
        if at < 0:
            continue
        index = starts[at]
        start, size = allocations[index]
        if address >= start + size:
            continue  # not in the weight pool
        rank = tensor_rank(name, layers)
        ranks[index] = min(rank, ranks.get(index, rank))
    by_rank: dict[int, list[int]] = {}
    for index in range(len(allocations)):
        by_rank.setdefault(ranks.get(index, FIRST), []).append(index)
    return [CopyGroup(rank, tuple(by_rank[rank])) for rank in sorted(by_rank)]


def waits(groups: Sequence[CopyGroup], layers: Layers) -> tuple[int, dict[str, int]]:
    """The group whose event the step waits for before its first piece (the embedding and
    layer 0's projections), and for each attention layer the one it waits for before the
    piece after it (its own MLP and the next layer's projections; the last layer: all, the
    final norm and lm_head included). Events are recorded in group order on one stream, so
    waiting for group g waits for every group before it."""
    ranks = [group.rank for group in groups]

    def through(rank: int) -> int:  # the last group of rank <= rank (0 if none)
        return max(bisect.bisect_right(ranks, rank) - 1, 0)

    return through(min(layers.by_name.values())), {
        name: len(groups) - 1 if layer == layers.last else through(layer + 1)
        for name, layer in layers.by_name.items()
    }
