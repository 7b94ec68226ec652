"""``residency.max_resident = "auto"``: how many models of a set stay on the GPU together.

A model fits beside others when its whole weights, vLLM's working memory and a KV pool that
holds its length (``max_model_len`` x ``gpu.min_concurrent_requests``, as ``make_plan``
targets it) fit its share. The planner takes the most models whose largest needs, with the
others asleep beside them, fit the card's ``gpu.memory_utilization``; each model's share is
then its need plus an equal part of what is left (so any that many of them fit together,
and each pool grows into the slack). Two small models on a big card: both resident, never
a switch. One model at a time when no two fit, and on a host without an NVIDIA GPU (its
engines run one at a time there, each planned alone).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.budget import served_weight_bytes
from vllm_offload.plan.kv import KvSizing, pool_bytes_for
from vllm_offload.plan.lengths import target
from vllm_offload.plan.records import BoxInputs, Notes, Plan, gib
from vllm_offload.plan.working_memory import gpu_overhead_bytes


def gpu_need(config: DeploymentConfig, model: ModelFacts, plan: Plan) -> int:
    """GPU bytes ``model`` needs on one card with no weights offloaded by 'auto': its
    weights (less a configured offload), vLLM's working memory (at its prefill chunk) and
    its target pool."""
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    weights = served_weight_bytes(config, model) // (tp * pp)
    offload = config.weights_offload.cpu_gib
    if offload != "auto":
        weights -= min(int(offload * GIB), weights)
    pool = config.gpu.kv_cache_memory_bytes
    if pool == "auto":
        tokens, requests = target(config, model)
        kv = KvSizing(
            model=model, dtype_bytes=plan.kv.dtype_bytes, block_tokens=plan.kv.block_tokens, tp=tp
        )
        pool = pool_bytes_for(kv, tokens, requests)
    return weights + gpu_overhead_bytes(model, config) + plan.prefill.working_bytes + pool


def resident_models(
    inputs: BoxInputs, alone: Mapping[str, Plan], asleep_bytes: int
) -> tuple[int, dict[str, float], Notes]:
    """(max_resident, each model's GPU share when more than one is resident, the decision).
    ``alone``: each model planned by itself; ``asleep_bytes``: what a sleeping engine keeps
    on the GPU (counted for the others only when they sleep)."""
    config, engines, facts, host = inputs.config, inputs.engines, inputs.facts, inputs.host
    if inputs.platform != "cuda" or not host.gpus:
        why = "residency.max_resident auto -> 1: no NVIDIA GPU (one engine at a time)"
        return 1, {}, Notes(decisions=(why,))
    total = min(g.total_bytes for g in host.gpus)
    usable = int(total * config.gpu.memory_utilization)
    needs = {n: gpu_need(engines[n], facts[n], alone[n]) for n in engines}
    largest = sorted(needs.values(), reverse=True)
    sleeps = config.residency.idle != "stop"  # 'auto' sleeps on an NVIDIA GPU
    for count in range(len(needs), 1, -1):
        asleep = (len(needs) - count) * asleep_bytes if sleeps else 0
        slack = usable - sum(largest[:count]) - asleep
        if slack >= 0:
            shares = {
                n: math.floor((need + slack / count) / total * 1e4) / 1e4  # not over it
                for n, need in needs.items()
            }
            listed = ", ".join(f"'{n}' {gib(need)}" for n, need in needs.items())
            return (
                count,
                shares,
                Notes(
                    decisions=(
                        f"residency.max_resident auto -> {count}: {count} of the models fit "
                        f"{config.gpu.memory_utilization:.0%} of the {gib(total)} GPU together "
                        f"(weights, working memory and a pool for each one's length: {listed}"
                        + (f"; {len(needs) - count} asleep beside them" if asleep else "")
                        + "); each gpu.memory_utilization set to its need and an equal part of the "
                        f"{gib(slack)} left",
                    )
                ),
            )
    return (
        1,
        {},
        Notes(
            decisions=(
                f"residency.max_resident auto -> 1: no two models fit the {gib(total)} GPU "
                f"together with pools for their lengths (the two largest need {gib(largest[0])} "
                f"and {gib(largest[1])})",
            )
        ),
    )
