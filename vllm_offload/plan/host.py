"""Host RAM: the reserve, what vLLM's own processes hold, offloaded weights, the host
extension of the KV pool, and the CPU tier in what is left (RAM and /dev/shm). One rule:
the launcher hands the planner's reserve to patched vLLM's own check of the tier."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.plan.records import (
    CpuTier,
    HostRam,
    KvLayout,
    Notes,
    PlanError,
    PlanInputs,
    Platform,
    gib,
)
from vllm_offload.upstream import compat
from vllm_offload.upstream.version import has_sync_loads
from vllm_offload.vllm_ext.knobs import (
    RAM_RESERVE_BYTES,
    RAM_RESERVE_FRACTION,
    gpu_host_ram_reserve,
)

# Host RAM kept free for the OS and page cache: knobs.gpu_host_ram_reserve (vLLM's check
# of the tier applies the same rule where no launcher passed a figure). The launcher hands
# this figure to patched vLLM (VLLMOFFLOAD_CPU_TIER_RAM_RESERVE_BYTES), whose check then
# agrees with the planner.
# RAM vLLM's own processes hold when that check runs (after the model is loaded): on an
# H200 host, 8B shape, one GPU, 2.52-2.64 GiB on 0.32.0 and 0.25.0 (patch 0001 logs it:
# benchmarks/results/h200-vllm-0.32.0/capacity/); on an H100 with 0.33.0, 2.66 GiB (8B)
# and 2.73 GiB (the demo model; h100-vllm-0.33.0/tier/, serve/). Without it the default tier
# was refused there (issue #13). Later they grow: CUDA graphs captured and a request
# served, an 8B engine's held 3.52-3.63 GiB (H200, 0.33.0; h200-vllm-0.33.0/start/), so
# the per-state figures plan and ps show are within 5 % of what the engine holds (#58).
# Each further GPU adds a worker process with its own CUDA context (not measured here:
# taken as 2 GiB).
SERVER_RAM_BYTES = int(3.75 * GIB)
SERVER_RAM_PER_EXTRA_RANK_BYTES = 2 * GIB
# /dev/shm vLLM uses itself before the check (its multi-process message queues).
SERVER_SHM_BYTES = 512 * 1024 * 1024
# vLLM's CPU backend (no CUDA context, no pinned staging): serving the default model
# (0.50 GiB of float32 weights, a 1 GiB pool) took 2.63 GiB of MemAvailable, so ~1.1 GiB
# for its API server, engine core and worker (benchmarks/results/cpu-host/
# default-model.json; their PSS, shared library pages included, was 1.84 GiB after a
# request). Further ranks: a worker each (not measured on this 2-core host: 1 GiB).
CPU_SERVER_RAM_BYTES = 2 * GIB
CPU_SERVER_RAM_PER_EXTRA_RANK_BYTES = 1 * GIB
# The CPU backend's reserve: RAM available already leaves out what other processes hold,
# so this is the kernel's and the page cache's headroom, not a GPU host's 8 GiB (which
# would refuse the default model on a small CI runner).
CPU_RAM_RESERVE_BYTES = 1 * GIB
CPU_RAM_RESERVE_FRACTION = 0.05


def ram_reserve(host: HostFacts, platform: Platform) -> int:
    if platform == "cpu":
        return max(CPU_RAM_RESERVE_BYTES, int(host.ram_total_bytes * CPU_RAM_RESERVE_FRACTION))
    return gpu_host_ram_reserve(host.ram_total_bytes)


def server_ram_bytes(world_size: int, platform: Platform) -> int:
    """Host RAM vLLM's own processes hold (on a GPU host, when its CPU-tier check runs)."""
    if platform == "cpu":
        return CPU_SERVER_RAM_BYTES + (world_size - 1) * CPU_SERVER_RAM_PER_EXTRA_RANK_BYTES
    return SERVER_RAM_BYTES + (world_size - 1) * SERVER_RAM_PER_EXTRA_RANK_BYTES


def weights_room_bytes(host: HostFacts, world_size: int) -> int:
    """The most offloaded weights host RAM holds per rank: the RAM available less the
    reserve and vLLM's own processes, shared by the ranks (each offloads its own part)."""
    room = host.ram_available_bytes - ram_reserve(host, "cuda")
    return max(0, room - server_ram_bytes(world_size, "cuda")) // world_size


def ram_words(host: HostFacts, world_size: int, platform: Platform) -> str:
    """Where the host RAM goes before any weights, in the plan's words."""
    return (
        f"{gib(host.ram_available_bytes)} available less the "
        f"{gib(ram_reserve(host, platform))} reserve and "
        f"~{gib(server_ram_bytes(world_size, platform))} for vLLM itself"
    )


def tenths(n: int) -> float:
    """Bytes as GiB rounded down to 0.1: a figure that fits, as a config value."""
    return math.floor(n / GIB * 10) / 10


def weights_ram_refusal(host: HostFacts, room: int, offloaded: int, world: int) -> PlanError:
    """Offloaded weights (per rank) the host RAM cannot hold: the largest figure that fits."""
    per = f" per GPU x {world} GPUs" if world > 1 else ""
    return PlanError(
        "weights_offload.cpu_gib",
        f"{gib(offloaded)}{per} of offloaded weights do not fit the host RAM: it holds "
        f"{gib(room)}{per} ({ram_words(host, world, 'cuda')}); set it <= {tenths(room):g}, "
        "or 'auto'",
    )


def ram_that_holds(in_ram: int, world: int, platform: Platform) -> str:
    """The host RAM that would hold ``in_ram`` bytes per rank (offloaded weights; on the
    CPU backend, weights and KV pool), in the plan's words."""
    held = in_ram * world + server_ram_bytes(world, platform)
    floor, fraction = (
        (CPU_RAM_RESERVE_BYTES, CPU_RAM_RESERVE_FRACTION)
        if platform == "cpu"
        else (RAM_RESERVE_BYTES, RAM_RESERVE_FRACTION)
    )
    # the reserve is the larger of a floor and a share of the total: solve for the total
    total = max(held + floor, held / (1 - fraction))
    return f"more host RAM (about {math.ceil(total / GIB)} GiB available)"


def cpu_backend_ram_check(inputs: PlanInputs, weights: int, pool: int) -> None:
    """vLLM's CPU backend keeps each rank's weights and KV pool in host RAM: they must fit
    the RAM available less the reserve and vLLM's own processes, or the plan is refused
    naming what to change (the pool's key and the largest pool that fits, or the model)."""
    config, host = inputs.config, inputs.host
    world = config.parallel.ranks
    room = host.ram_available_bytes - ram_reserve(host, "cpu") - server_ram_bytes(world, "cpu")
    room = max(0, room) // world  # per rank
    if weights + pool <= room:
        return
    per = f" per rank x {world} ranks" if world > 1 else ""
    held = f"host RAM holds {gib(room)}{per} ({ram_words(host, world, 'cpu')})"
    pool_room = room - weights
    if pool_room < GIB // 4:  # not even a short request's pool: the model is the problem
        raise PlanError(
            "model.path",
            f"vLLM's CPU backend keeps the weights in host RAM: {gib(weights)}{per} of "
            f"weights and a {gib(pool)} KV pool do not fit; {held}. Use a smaller or "
            f"quantized model, or {ram_that_holds(weights + pool, world, 'cpu')}",
        )
    largest = pool_room // (1024 * 1024) * 1024 * 1024  # whole MiB
    if inputs.env.get("VLLM_CPU_KVCACHE_SPACE"):
        raise PlanError(
            "gpu.kv_cache_memory_bytes",
            f"VLLM_CPU_KVCACHE_SPACE={inputs.env['VLLM_CPU_KVCACHE_SPACE']} (the environment "
            f"wins inside vLLM) asks a {gib(pool)} KV pool{per} beside {gib(weights)} of "
            f"weights; {held}: set VLLM_CPU_KVCACHE_SPACE <= {largest // GIB}, or unset it "
            f"and set gpu.kv_cache_memory_bytes <= {largest}",
        )
    raise PlanError(
        "gpu.kv_cache_memory_bytes",
        f"vLLM's CPU backend keeps the KV pool in host RAM: a {gib(pool)} pool{per} beside "
        f"{gib(weights)} of weights does not fit; {held}: set it <= {largest} "
        f"({gib(largest)})",
    )


@dataclass(frozen=True, kw_only=True)
class TierRoom:
    """The largest CPU tier this host holds, by RAM and by /dev/shm, in bytes: what patched
    vLLM will find when it checks the tier, once its own processes and the offloaded
    weights are in memory."""

    ram_bytes: int
    shm_bytes: int

    @property
    def bytes(self) -> int:
        return min(self.ram_bytes, self.shm_bytes)


def tier_room(
    host: HostFacts, reserve: int, weights_in_ram: int, world_size: int, platform: Platform
) -> TierRoom:
    ram = (
        host.ram_available_bytes - reserve - weights_in_ram - server_ram_bytes(world_size, platform)
    )
    return TierRoom(ram_bytes=max(0, ram), shm_bytes=max(0, host.shm_free_bytes - SERVER_SHM_BYTES))


def extension_bytes(inputs: PlanInputs) -> tuple[int, Notes]:
    """kv_offload.host_extension_gib in bytes, if this model and platform can have it."""
    config, model, platform = inputs.config, inputs.model, inputs.platform
    extension = int(config.kv_offload.host_extension_gib * GIB)
    if not extension:
        return 0, Notes()
    notes = Notes()
    if platform != "cuda":
        notes = Notes.problem(
            "kv_offload.host_extension_gib",
            "the host extension maps host RAM into the GPU's KV pool, which needs an NVIDIA "
            "GPU; set it to 0",
        )
    other = sorted({layer.kind for layer in model.layers} - {"full"})
    if other:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"the host extension places models whose layers are all full attention; "
            f"{model.architecture} also has {', '.join(other)} layers: set it to 0",
        )
    return extension, notes


def configured_tier_bytes(
    config: DeploymentConfig, layout: KvLayout, room: TierRoom
) -> tuple[int, Notes]:
    """The CPU tier, all ranks together: none, as configured (the seed's num_cpu_blocks
    translated, with a warning), or (auto) the room the host has, in whole GiB."""
    if layout.backend == "none":
        return 0, Notes()
    if (blocks := config.kv_offload.num_cpu_blocks) is not None:
        configured = config.kv_offload.block_size
        tier, warning = compat.tier_from_num_cpu_blocks(
            blocks,
            layout.block_tokens if configured != "auto" else None,
            layout.bytes_per_token,
            config.parallel.tensor_parallel_size,
        )
        return tier, Notes(warnings=(warning,))
    if config.kv_offload.cpu_tier_gib == "auto":
        bound = "host RAM" if room.ram_bytes <= room.shm_bytes else "/dev/shm"
        tier = room.bytes // GIB * GIB  # whole GiB: easy to read, easy to repeat
        return tier, Notes(
            decisions=(
                f"kv_offload.cpu_tier_gib auto -> {tier // GIB}: the room {bound} leaves (RAM "
                f"{gib(room.ram_bytes)} after reserve, vLLM and offloaded weights; /dev/shm "
                f"{gib(room.shm_bytes)}), whole GiB",
            )
        )
    return int(config.kv_offload.cpu_tier_gib * GIB), Notes()


def size_cpu_tier(
    inputs: PlanInputs, layout: KvLayout, weights_offloaded: int, extension: int
) -> tuple[CpuTier, HostRam, Notes]:
    """The host extension's RAM first (refused where it does not fit), then the CPU tier
    in what is left; a configured tier the RAM or /dev/shm cannot hold is a problem."""
    config, host, platform = inputs.config, inputs.host, inputs.platform
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    reserve = ram_reserve(host, platform)
    ram_left = tier_room(host, reserve, weights_offloaded * tp * pp, tp * pp, platform).ram_bytes
    if extension * tp * pp > ram_left:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"{gib(extension)} per GPU{f' x {tp * pp} GPUs' if tp * pp > 1 else ''} do "
            f"not fit the host RAM left: {gib(ram_left)} after the reserve, vLLM and "
            f"offloaded weights; set it <= {ram_left // (tp * pp) // GIB}",
        )
    room = tier_room(host, reserve, (weights_offloaded + extension) * tp * pp, tp * pp, platform)
    tier, notes = configured_tier_bytes(config, layout, room)
    blocks = tier // (layout.bytes_per_block * tp) if layout.bytes_per_block else 0
    ram = HostRam(
        total_bytes=host.ram_total_bytes,
        available_bytes=host.ram_available_bytes,
        reserve_bytes=reserve,
        shm_free_bytes=host.shm_free_bytes,
        server_bytes=server_ram_bytes(tp * pp, platform),
        tier_room_ram_bytes=room.ram_bytes,
        tier_room_shm_bytes=room.shm_bytes,
    )
    notes += tier_fits(layout, tier, ram, weights_offloaded * tp)
    return CpuTier(bytes=tier, blocks=blocks, tokens=blocks * layout.block_tokens), ram, notes


def tier_fits(layout: KvLayout, tier: int, ram: HostRam, weights_in_ram: int) -> Notes:
    """Refuse a tier vLLM could not take: more than the RAM left, or (native: vLLM maps it
    from /dev/shm) more than /dev/shm holds."""
    notes = Notes()
    if tier > ram.tier_room_ram_bytes:
        notes += Notes.problem(
            "kv_offload.cpu_tier_gib",
            f"a {tier / GIB:.2f} GiB CPU tier does not fit the host RAM "
            f"({ram.available_bytes / GIB:.2f} GiB available, "
            f"{ram.reserve_bytes / GIB:.2f} GiB kept in reserve, "
            f"~{ram.server_bytes / GIB:.2f} GiB for vLLM itself"
            + (f", {weights_in_ram / GIB:.2f} GiB of offloaded weights" if weights_in_ram else "")
            + f"); the largest that fits is {ram.tier_room_ram_bytes // GIB} GiB",
        )
    if layout.backend == "native" and tier > ram.tier_room_shm_bytes:
        notes += Notes.problem(
            "kv_offload.cpu_tier_gib",
            f"vLLM places the CPU tier in /dev/shm, which has "
            f"{ram.shm_free_bytes / GIB:.2f} GiB free (vLLM uses some itself); set "
            f"cpu_tier_gib <= {ram.tier_room_shm_bytes // GIB} or enlarge /dev/shm "
            "(`mount -o remount,size=100G /dev/shm`, or docker --shm-size; README: Giving "
            "/dev/shm more room)",
        )
    return notes


def sync_load_budget(inputs: PlanInputs, layout: KvLayout, pool_bytes: int) -> int:
    """vLLM 0.33's sync-load budget a step, for its native CPU tier: patch 0005's
    layer-wise loads ride on it (a hit vLLM loads inside its step), so 'auto' lifts the
    limit (the whole pool) where they are on, and asks none where they are off; 0 on a
    release without one (0.32.0's series loads in the scheduler itself)."""
    offload = inputs.config.kv_offload
    if layout.backend != "native" or not has_sync_loads(inputs.vllm_release):
        return 0
    if offload.sync_load_budget_gib == "auto":
        return pool_bytes if offload.layerwise_loads else 0
    return int(offload.sync_load_budget_gib * GIB)
