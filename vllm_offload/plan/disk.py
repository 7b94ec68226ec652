"""The disk tier behind the CPU tier: vLLM's filesystem tier in a directory of the
configured disk, bounded (auto: half of the filesystem less its reserve), each model's
files under its own fingerprint; or no disk tier, with a problem saying why not."""

from __future__ import annotations

import os

from vllm_offload import disk_layout
from vllm_offload.config import DeploymentConfig
from vllm_offload.disk_facts import NETWORK_FILESYSTEMS, RAM_FILESYSTEMS, DiskFacts
from vllm_offload.hardware import GIB
from vllm_offload.plan.kv import KvSizing, request_kv_bytes
from vllm_offload.plan.records import DiskTier, KvLayout, Notes, PlanInputs, gib

# The disk tier never lets its filesystem's free space fall below this (the launcher hands
# it to the tier, which evicts to keep it); 'auto' sizes the tier at half of what is left.
DISK_RESERVE_BYTES = 10 * GIB
DISK_RESERVE_FRACTION = 0.05
DISK_AUTO_SHARE = 0.5
NO_DISK_TIER = DiskTier(path="", root="", bytes=0, tokens=0, reserve_bytes=0)


def plan_disk_tier(
    inputs: PlanInputs, disk: DiskFacts | None, layout: KvLayout, max_model_len: int
) -> tuple[DiskTier, Notes]:
    """The disk tier as configured, or none (with a problem saying why not); it holds at
    least one request of ``max_model_len`` tokens."""
    config, model = inputs.config, inputs.model
    path = config.kv_offload.disk_path
    if not path:
        return NO_DISK_TIER, Notes()
    tp = config.parallel.tensor_parallel_size
    kv = KvSizing(
        model=model, dtype_bytes=layout.dtype_bytes, block_tokens=layout.block_tokens, tp=tp
    )
    request_bytes = request_kv_bytes(kv, max_model_len) * tp
    refusal = unusable(config, layout, disk, path)
    if refusal:
        return NO_DISK_TIER, Notes.problem(*refusal)
    assert disk is not None  # unusable refuses a missing directory
    reserve = max(DISK_RESERVE_BYTES, int(disk.total_bytes * DISK_RESERVE_FRACTION))
    room = max(0, disk.total_bytes - reserve)
    notes = Notes()
    if config.kv_offload.disk_gib == "auto":
        size = int(room * DISK_AUTO_SHARE) // GIB * GIB
        notes = Notes(
            decisions=(
                f"kv_offload.disk_gib auto -> {size // GIB}: half of {path}'s "
                f"{gib(disk.total_bytes)} less the {gib(reserve)} it always keeps free",
            )
        )
    else:
        size = int(config.kv_offload.disk_gib * GIB)
        if size > room:
            return NO_DISK_TIER, Notes.problem(
                "kv_offload.disk_gib",
                f"{path} is a {gib(disk.total_bytes)} "
                f"filesystem and keeps {gib(reserve)} free: set disk_gib <= "
                f"{room // GIB}",
            )
    if size < request_bytes:
        return NO_DISK_TIER, notes + Notes.problem(
            "kv_offload.disk_gib",
            f"a {gib(size)} disk tier holds less than one "
            f"full-length request ({gib(request_bytes)}); give it more, or set "
            "disk_path = ''",
        )
    per_token = layout.bytes_per_token
    tokens = (
        size // (per_token * tp) // layout.block_tokens * layout.block_tokens if per_token else 0
    )
    # Each model's files under its own folder: changed weights at the same path (a new
    # fingerprint) never find another model's KV.
    root = str(disk_layout.tier_root(path) / model.fingerprint)
    return DiskTier(
        path=path, root=root, bytes=size, tokens=tokens, reserve_bytes=reserve
    ), notes + slow_disk_warnings(disk, path)


def unusable(
    config: DeploymentConfig, layout: KvLayout, disk: DiskFacts | None, path: str
) -> tuple[str, str] | None:
    """(field, message) when the disk tier cannot go at ``path`` with this configuration."""
    if layout.backend != "native":
        return (
            "kv_offload.disk_path",
            "the disk tier sits behind vLLM's native CPU "
            "tier: set kv_offload.backend = native, or disk_path = ''",
        )
    if config.kv_offload.store_threshold >= 2:
        return (
            "kv_offload.store_threshold",
            "vLLM's tiering (the disk tier) does not "
            "take a store threshold (tiering/spec.py refuses it): set it to 0, "
            "or disk_path = ''",
        )
    if os.path.realpath(path) == "/":
        return (
            "kv_offload.disk_path",
            "not the root directory: give the disk tier a "
            "directory of its own (e.g. /nvme/vllm-kv)",
        )
    if disk is None or not disk.exists:
        return (
            "kv_offload.disk_path",
            f"{path} does not exist; create it (`mkdir -p "
            f"{path}`, writable by the server's user) or set disk_path = ''",
        )
    if not disk.writable:
        return (
            "kv_offload.disk_path",
            f"{path} is not writable here; give the server's "
            "user write access (chown/chmod) or choose another directory",
        )
    if disk.filesystem in RAM_FILESYSTEMS:
        return (
            "kv_offload.disk_path",
            f"{path} is on {disk.filesystem}, which is "
            "RAM (the CPU tier's); choose a directory on a disk (NVMe)",
        )
    return None


def slow_disk_warnings(disk: DiskFacts, path: str) -> Notes:
    """What makes a usable disk tier slow: a network filesystem, no O_DIRECT."""
    warnings = []
    if disk.filesystem in NETWORK_FILESYSTEMS:
        warnings.append(
            f"the disk tier {path} is on {disk.filesystem}, a network filesystem: every KV "
            "read is a round trip; a local NVMe directory is much faster"
        )
    if disk.o_direct is False:
        warnings.append(
            f"{path} does not take O_DIRECT: vLLM's disk tier falls back to buffered I/O, "
            "and its reads and writes go through the page cache (RAM the CPU tier needs)"
        )
    return Notes(warnings=tuple(warnings))
