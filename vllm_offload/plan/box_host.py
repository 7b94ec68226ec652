"""The host RAM and /dev/shm of a set of models: what each engine holds while alive and
away, the CPU tiers left 'auto' (equal shares of what the set leaves), and the host as one
model finds it beside the others.

Models asleep keep their engines: each holds, at level 1, its weights in host RAM (and
every engine its own processes, offloaded weights, host extension and CPU tier), so every
engine's RAM must fit the host at once. Stopped models hold nothing.

A model on the GPU keeps that copy of its weights too, unless residency.host_copy =
'release' gives it back after each wake (``holds_serving``). That lowers what a serving
engine holds, not the peak: at every switch the model put away copies its weights out
while the one coming in still holds its copy, so every engine's copy is held at once then,
and the set is planned for that moment either way.

In deep sleep (residency.deep_sleep) a model asleep holds what its engine kept on the GPU
in host RAM too: the driver's checkpoint of its CUDA context and graphs. The weights a model
asleep keeps on the GPU (residency.asleep_weights_on_gpu_gib) are not in its copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.plan.host import SERVER_SHM_BYTES, ram_reserve, server_ram_bytes
from vllm_offload.plan.records import Notes, Plan, gib

Idle = Literal["sleep", "stop"]
# Host RAM a level-1 sleep keeps, in vllm_ext.sleep's arena (made at the first sleep and
# kept): the weights, byte for byte, and vLLM's runtime and CUDA-graph pools, which it keeps
# at every level and which do not grow with the model: +15.55 GiB for 14.96 GiB of weights
# on the H200 (8B shape; docs/benchmarks.md, raw benchmarks/results/h200-vllm-0.32.0/switch/),
# 2.88 GiB for a 1B shape's ~2.30 GiB on an H100 (issue #43): ~0.58-0.59 GiB of pools
# either way. A factor of the weights (1.1x before) under-counted the small model.
SLEEP_POOLS_BYTES = int(0.6 * GIB)
# GPU memory an engine asleep still holds (H200, Llama-3-8B shape, CUDA graphs, issue #31):
# 1.53 GiB at levels 1 and 2 in the final runs, 2.48 GiB in the first try
# (benchmarks/results/h200-vllm-0.32.0/switch/); planned with room to spare. In deep sleep
# the driver's checkpoint moves it to host RAM.
ASLEEP_GPU_BYTES = 3 * GIB


@dataclass(frozen=True, kw_only=True)
class Away:
    """How the set's engines spend their time off the GPU: asleep or stopped, at which
    sleep level, and whether several are alive at once (else each is planned alone)."""

    idle: Idle  # the models that switch (those that never do: idle_of)
    level: int
    together: bool
    idle_of: Mapping[str, Idle] = field(default_factory=dict)  # where not ``idle``
    deep: bool = False  # asleep, checkpointed (residency.deep_sleep)
    # by model: how much smaller its sleep copy is for the weights it keeps on the GPU
    # (plan.box_asleep.host_copy_less)
    copy_less: Mapping[str, int] = field(default_factory=dict)

    def of(self, name: str) -> Idle:
        return self.idle_of.get(name, self.idle)

    def held(self, plan: Plan, name: str) -> int:
        """Host RAM the engine of ``name`` holds while alive and away."""
        return holds(plan, self.of(name), self.level, self.deep, self.copy_less.get(name, 0))


def holds(plan: Plan, idle: Idle, level: int, deep: bool = False, copy_less: int = 0) -> int:
    """Host RAM one engine holds while alive and away (besides its CPU tier); ``deep``:
    asleep, checkpointed; ``copy_less``: how much smaller its sleep copy of the weights is
    (those it keeps on the GPU asleep)."""
    tp = plan.tensor_parallel_size
    engine = server_ram_bytes(tp, plan.platform)
    engine += (plan.weights.offloaded_bytes + plan.extension.bytes) * tp
    if plan.platform == "cpu":  # the CPU backend's weights and KV pool are in host RAM
        engine += (plan.weights.gpu_bytes + plan.gpu.kv_pool_bytes) * tp
    copied = plan.weights.gpu_bytes - min(copy_less, plan.weights.gpu_bytes)
    backup = (copied + SLEEP_POOLS_BYTES) * tp if level == 1 else 0
    backup += ASLEEP_GPU_BYTES * tp if deep else 0
    return engine + (backup if idle == "sleep" else 0)


def holds_serving(plan: Plan, idle: Idle, level: int, keeps_copy: bool, copy_less: int = 0) -> int:
    """Host RAM one engine holds while on the GPU (besides its CPU tier): as away, less
    its sleep copy where it gives it back (residency.host_copy = 'release')."""
    return holds(plan, idle if keeps_copy else "stop", level, copy_less=copy_less)


def tier_shares(
    alone: Mapping[str, Plan],
    configs: Mapping[str, DeploymentConfig],
    host: HostFacts,
    away: Away,
) -> tuple[dict[str, int], Notes]:
    """The 'auto' CPU tiers: equal shares, in whole GiB, of the RAM and /dev/shm every
    engine's holdings and the configured tiers leave (engines that never run together:
    each planned alone)."""
    if not away.together:
        return {}, Notes()  # one engine at a time: each planned alone, as it runs
    reserve = ram_reserve(host, next(iter(alone.values())).platform)
    auto = [
        n
        for n, c in configs.items()
        if c.kv_offload.cpu_tier_gib == "auto"
        and c.kv_offload.num_cpu_blocks is None
        and alone[n].kv.backend != "none"
    ]
    fixed = sum(away.held(p, n) for n, p in alone.items())
    configured = sum(p.cpu_tier.bytes for n, p in alone.items() if n not in auto)
    ram = host.ram_available_bytes - reserve - fixed - configured
    shm = host.shm_free_bytes - SERVER_SHM_BYTES * len(alone) - configured
    held = ", ".join(f"'{n}' {gib(away.held(p, n))}" for n, p in alone.items())
    if ram < 0 or shm < 0:
        short = f"{gib(-ram)} of host RAM" if ram < 0 else f"{gib(-shm)} of /dev/shm"
        return {}, Notes.problem(
            "models",
            f"the models need {short} more than this host "
            f"has for them (each engine while asleep or serving: {held}; "
            f"configured CPU tiers {gib(configured)}; reserve "
            f"{gib(reserve)}): residency.idle = 'stop', fewer "
            "models, or smaller CPU tiers",
        )
    if not auto:
        return {}, Notes()
    share = min(ram, shm) // len(auto) // GIB * GIB
    return {n: share for n in auto}, Notes(
        decisions=(
            f"kv_offload.cpu_tier_gib auto -> {share // GIB} for each of {', '.join(auto)}: an "
            f"equal share of what the engines leave (RAM {gib(ram)} after the reserve, the "
            f"engines' own holdings ({held}) and configured tiers; /dev/shm {gib(shm)})",
        )
    )


def host_view(
    host: HostFacts,
    name: str,
    alone: Mapping[str, Plan],
    tiers: Mapping[str, int],
    away: Away,
) -> HostFacts:
    """The host as model ``name`` finds it: less what the other engines hold (their
    processes, weights, tiers) and what its own sleep keeps."""
    if not away.together:
        return host
    own = alone[name]
    backup = away.held(own, name) - holds(own, "stop", away.level)
    others = [
        (away.held(p, n), tiers.get(n, p.cpu_tier.bytes)) for n, p in alone.items() if n != name
    ]
    ram = sum(h + t for h, t in others) + backup
    shm = sum(SERVER_SHM_BYTES + t for _h, t in others)
    return replace(
        host,
        ram_available_bytes=host.ram_available_bytes - ram,
        shm_free_bytes=max(0, host.shm_free_bytes - shm),
    )
