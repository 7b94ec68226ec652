"""Host RAM: the reserve, what vLLM's own processes hold, offloaded weights, the host
extension of the KV pool, and the CPU tier in what is left (RAM and /dev/shm). One rule:
the launcher hands the planner's reserve to patched vLLM's own check of the tier."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_offload import compat
from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.plan.records import (
    CpuTier,
    HostRam,
    KvLayout,
    Notes,
    PlanError,
    PlanInputs,
    gib,
)

# Host RAM kept free for the OS and page cache. The launcher hands this figure to patched
# vLLM (VLLM_CPU_TIER_RAM_RESERVE_BYTES), whose own check of the tier then agrees with
# the planner by construction.
RAM_RESERVE_BYTES = 8 * GIB
RAM_RESERVE_FRACTION = 0.10
# RAM vLLM's own processes hold when that check runs (after the model is loaded): on an
# H200 host, 8B shape, one GPU, 2.52-2.64 GiB on 0.32.0 and 0.25.0 (patch 0001 logs it:
# benchmarks/results/h200-vllm-0.32.0/capacity/); on an H100 with 0.33.0, 2.66 GiB (8B)
# and 2.73 GiB (the demo model; h100-vllm-0.33.0/tier/, serve/). Without it the default tier
# was refused there (issue #13). Each further GPU adds a worker process with its own CUDA
# context (not measured here: taken as 2 GiB).
SERVER_RAM_BYTES = 4 * GIB
SERVER_RAM_PER_EXTRA_RANK_BYTES = 2 * GIB
# /dev/shm vLLM uses itself before the check (its multi-process message queues).
SERVER_SHM_BYTES = 512 * 1024 * 1024


def ram_reserve(host: HostFacts) -> int:
    return max(RAM_RESERVE_BYTES, int(host.ram_total_bytes * RAM_RESERVE_FRACTION))


def server_ram_bytes(world_size: int) -> int:
    """Host RAM vLLM's own processes hold when its CPU-tier check runs."""
    return SERVER_RAM_BYTES + (world_size - 1) * SERVER_RAM_PER_EXTRA_RANK_BYTES


def weights_room_bytes(host: HostFacts, world_size: int) -> int:
    """The most offloaded weights host RAM holds per rank: the RAM available less the
    reserve and vLLM's own processes, shared by the ranks (each offloads its own part)."""
    room = host.ram_available_bytes - ram_reserve(host) - server_ram_bytes(world_size)
    return max(0, room) // world_size


def ram_words(host: HostFacts, world_size: int) -> str:
    """Where the host RAM goes before any weights, in the plan's words."""
    return (
        f"{gib(host.ram_available_bytes)} available less the {gib(ram_reserve(host))} "
        f"reserve and ~{gib(server_ram_bytes(world_size))} for vLLM itself"
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
        f"{gib(room)}{per} ({ram_words(host, world)}); set it <= {tenths(room):g}, or 'auto'",
    )


def ram_that_holds(offloaded: int, world: int) -> str:
    """The host RAM that would hold ``offloaded`` weights per rank, in the plan's words."""
    held = offloaded * world + server_ram_bytes(world)
    # the reserve is the larger of a floor and a share of the total: solve for the total
    total = max(held + RAM_RESERVE_BYTES, held / (1 - RAM_RESERVE_FRACTION))
    return f"more host RAM (about {math.ceil(total / GIB)} GiB available)"


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


def tier_room(host: HostFacts, reserve: int, weights_in_ram: int, world_size: int) -> TierRoom:
    ram = host.ram_available_bytes - reserve - weights_in_ram - server_ram_bytes(world_size)
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
    config, host = inputs.config, inputs.host
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    reserve = ram_reserve(host)
    ram_left = tier_room(host, reserve, weights_offloaded * tp * pp, tp * pp).ram_bytes
    if extension * tp * pp > ram_left:
        raise PlanError(
            "kv_offload.host_extension_gib",
            f"{gib(extension)} per GPU{f' x {tp * pp} GPUs' if tp * pp > 1 else ''} do "
            f"not fit the host RAM left: {gib(ram_left)} after the reserve, vLLM and "
            f"offloaded weights; set it <= {ram_left // (tp * pp) // GIB}",
        )
    room = tier_room(host, reserve, (weights_offloaded + extension) * tp * pp, tp * pp)
    tier, notes = configured_tier_bytes(config, layout, room)
    blocks = tier // (layout.bytes_per_block * tp) if layout.bytes_per_block else 0
    ram = HostRam(
        total_bytes=host.ram_total_bytes,
        available_bytes=host.ram_available_bytes,
        reserve_bytes=reserve,
        shm_free_bytes=host.shm_free_bytes,
        server_bytes=server_ram_bytes(tp * pp),
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
