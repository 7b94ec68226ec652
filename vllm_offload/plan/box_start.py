"""Several models ready in about the time of one (issue #58): which engines start side by
side at start-up.

Where not all models fit on their GPUs at once, start-up brings each model that sleeps
in and puts it to sleep once (its first sleep makes its host copy), then brings the
default in. An engine holds its whole GPU share from its start until it sleeps, so
engines start side by side only where their shares fit their GPUs together; one after
another they took 321.6 s for three 8B models on an H200, against ~150 s for one.

A model with a fixed KV pool (``gpu.kv_cache_memory_bytes``) needs far less than the GPU
less its sleepers: its weights, vLLM's working memory and that pool. vLLM then ignores
``gpu.memory_utilization`` for its pool, and checks only that much is free as it starts,
so such a model that sleeps gets its need (and a margin) as its share, and engines start
side by side. A pool left to fill the share ('auto') fills the GPU: those start one at a
time. Pure: the set's plans in, the shares and the batches out.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, GpuFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.records import Notes, Plan
from vllm_offload.plan.together import gpu_need

# What an engine holds beside what vLLM's pools count, when others start beside it (its
# CUDA context, cuBLAS and NCCL workspaces: ~0.5-0.6 GiB on an H200), with room to spare.
START_MARGIN_BYTES = GIB


def fixed_pool_shares(
    switching: Sequence[str],
    configs: Mapping[str, DeploymentConfig],
    facts: Mapping[str, ModelFacts],
    alone: Mapping[str, Plan],
    total_bytes: Mapping[str, int],
) -> tuple[dict[str, DeploymentConfig], Notes]:
    """Each model of ``switching`` (models that sleep between turns) whose KV pool is fixed,
    with its need and a margin as its GPU share where that is less than its share now
    (``total_bytes``: its GPUs' size, the smallest)."""
    lowered: dict[str, DeploymentConfig] = {}
    said: list[str] = []
    for name in switching:
        config = configs[name]
        if config.gpu.kv_cache_memory_bytes == "auto":
            continue
        need = gpu_need(config, facts[name], alone[name]) + START_MARGIN_BYTES
        share = math.ceil(need / total_bytes[name] * 1e4) / 1e4
        if share >= config.gpu.memory_utilization:
            continue
        gpu = config.gpu.model_copy(update={"memory_utilization": share})
        lowered[name] = config.model_copy(update={"gpu": gpu})
        said.append(
            f"'{name}': gpu.memory_utilization {config.gpu.memory_utilization:g} -> {share:g}: "
            "its fixed KV pool, weights and working memory (vLLM checks only that much is "
            "free as it starts), so that engines start side by side"
        )
    return lowered, Notes(decisions=tuple(said))


def start_batches(
    order: Sequence[str],
    budgets: Mapping[str, int],
    gpus: Mapping[str, tuple[int, ...]],
    cards: Sequence[GpuFacts],
    utilization: float,
    asleep: Mapping[str, int],
) -> tuple[tuple[str, ...], ...]:
    """``order``'s models (those start-up brings in and puts to sleep, in its order) in
    batches that start side by side: each model's GPU share (``budgets``) and margin added
    to its GPUs' (``gpus``; none: the one GPU) while they fit ``utilization`` of each,
    beside what the models of the batches before keep there asleep (``asleep``)."""
    usable = {c.index: int(c.total_bytes * utilization) for c in cards}
    batches: list[list[str]] = []
    held: dict[int, int] = {}
    slept: Counter[int] = Counter()  # what the batches before keep on each GPU asleep
    sleeping: Counter[int] = Counter()  # what this batch will keep there
    for name in order:
        mine = gpus.get(name) or tuple(usable)[:1]
        need = budgets[name] + START_MARGIN_BYTES
        fits = batches and all(held.get(g, 0) + need <= usable.get(g, 0) for g in mine)
        if not fits:
            slept, sleeping = slept + sleeping, Counter()
            batches.append([])
            held = dict(slept)
        batches[-1].append(name)
        for g in mine:
            held[g] = held.get(g, 0) + need
            sleeping[g] += asleep.get(name, 0)
    return tuple(tuple(batch) for batch in batches)
