"""What the host offers: GPUs (NVML, with their PCIe link), RAM, /dev/shm, memlock limit,
CPUs (and whether their AMX may be used), whether it is WSL2, and whether its NVIDIA
driver can checkpoint a process. The disk tier's directory: ``disk_facts``.

``probe()`` reads this machine; ``declared()`` describes a machine the user
names (``--gpu-mem-gib 24``) so a plan can be made for a card that is not here.
Both return the same immutable record, so the planner never knows which it got.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psutil

from vllm_offload.vllm_ext import amx
from vllm_offload.vllm_ext.amx import AmxState

GIB = 1 << 30
SHM_PATH = "/dev/shm"


@dataclass(frozen=True, kw_only=True)
class GpuFacts:
    index: int
    name: str
    total_bytes: int
    free_bytes: int
    # The PCIe link the GPU and host can run at (NVML's maximum: the current one drops
    # while idle); None where unknown (a declared GPU).
    pcie_generation: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True, kw_only=True)
class HostFacts:
    gpus: tuple[GpuFacts, ...]
    ram_total_bytes: int
    ram_available_bytes: int
    shm_free_bytes: int
    memlock_limit_bytes: int | None  # None: unlimited
    cpu_count: int
    gpu_source: str  # "nvml", "declared" or "none": where the GPU figures came from
    wsl: bool = False  # Windows Subsystem for Linux 2
    # Intel AMX: absent, or present and granted or refused by the kernel (amx.py), and why.
    amx: AmxState = "absent"
    amx_detail: str = ""
    # The NVIDIA driver's process checkpoint (residency.deep_sleep): driver_checkpoints().
    process_checkpoint: bool = False

    @property
    def has_nvidia_gpu(self) -> bool:
        return bool(self.gpus)


@contextmanager
def nvml_devices() -> Iterator[tuple[Any, list[Any]]]:
    """(the pynvml module, NVML device handles); no handles where pynvml, the driver or a
    GPU is missing. NVML is shut down on exit."""
    try:
        import pynvml
    except ImportError:
        yield None, []
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield pynvml, []
        return
    try:
        count = pynvml.nvmlDeviceGetCount()
        yield pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    finally:
        pynvml.nvmlShutdown()


def cuda_memory(nvml: Any, handle: Any) -> tuple[int, int]:
    """(total, free) bytes of a GPU as CUDA counts them, the total vLLM budgets a share
    of: NVML's total less what the driver and firmware reserve (0.47 GiB on an H100 80GB:
    NVML 79.65 GiB, CUDA 79.18). NVML's plain figures where the driver has no v2 query."""
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(mem.total) - int(mem.reserved), int(mem.free)
    except (nvml.NVMLError, AttributeError):
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(mem.total), int(mem.free)


def probe_gpus() -> tuple[GpuFacts, ...]:
    """NVIDIA GPUs through NVML; an empty tuple where there is no driver or no GPU. Where
    CUDA_VISIBLE_DEVICES names GPUs by index, those alone (NVML itself lists every GPU;
    the engines see only those), keeping NVML's numbers."""
    gpus = []
    visible = visible_indexes(os.environ.get("CUDA_VISIBLE_DEVICES"))
    with nvml_devices() as (nvml, handles):
        for i, handle in enumerate(handles):
            if visible is not None and i not in visible:
                continue
            total, free = cuda_memory(nvml, handle)
            name = nvml.nvmlDeviceGetName(handle)
            link: list[int | None] = []
            for query in (
                nvml.nvmlDeviceGetMaxPcieLinkGeneration,
                nvml.nvmlDeviceGetMaxPcieLinkWidth,
            ):
                try:
                    link.append(int(query(handle)))
                except nvml.NVMLError:  # not a PCIe device (SXM boards still report it)
                    link.append(None)
            gpus.append(
                GpuFacts(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    total_bytes=total,
                    free_bytes=free,
                    pcie_generation=link[0],
                    pcie_width=link[1],
                )
            )
    return tuple(gpus)


def visible_indexes(value: str | None) -> set[int] | None:
    """CUDA_VISIBLE_DEVICES as NVML indexes; None where it is unset or names GPUs another
    way (UUIDs, MIG instances: every GPU is counted then)."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return {int(p) for p in parts}


# The NVIDIA driver's library, and the call of its process checkpoint (driver 570 or newer,
# Linux) that deep sleep needs (box.process_checkpoint).
LIBCUDA = "libcuda.so.1"
CHECKPOINT_CALL = "cuCheckpointProcessLock"


def driver_checkpoints() -> bool:
    """Whether this host's NVIDIA driver can checkpoint a process."""
    return _library_has(LIBCUDA, CHECKPOINT_CALL)


# Cached: the driver does not change under a running process, and the manager probes the
# host at every poll.
@functools.cache
def _library_has(library: str, symbol: str) -> bool:
    try:
        return hasattr(ctypes.CDLL(library), symbol)
    except OSError:
        return False


def _memlock_limit() -> int | None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _wsl() -> bool:
    try:
        with open("/proc/sys/kernel/osrelease") as release:
            return "microsoft" in release.read().lower()
    except OSError:
        return False


def _shm_free() -> int:
    try:
        return shutil.disk_usage(SHM_PATH).free
    except OSError:
        return 0


def probe() -> HostFacts:
    gpus = probe_gpus()
    vm = psutil.virtual_memory()
    amx_state, amx_detail = amx.state(amx.read_cpuinfo())
    return HostFacts(
        gpus=gpus,
        ram_total_bytes=int(vm.total),
        ram_available_bytes=int(vm.available),
        shm_free_bytes=_shm_free(),
        memlock_limit_bytes=_memlock_limit(),
        cpu_count=os.cpu_count() or 1,
        gpu_source="nvml" if gpus else "none",
        wsl=_wsl(),
        amx=amx_state,
        amx_detail=amx_detail,
        process_checkpoint=bool(gpus) and driver_checkpoints(),
    )


def declared(
    base: HostFacts,
    *,
    gpu_mem_gib: float | None = None,
    gpu_count: int = 1,
    ram_gib: float | None = None,
) -> HostFacts:
    """``base`` with the GPUs (and optionally the RAM) replaced by declared ones. A declared
    RAM comes with a /dev/shm of half of it, the size Linux gives that tmpfs by default."""
    facts = base
    if gpu_mem_gib is not None:
        size = int(gpu_mem_gib * GIB)
        gpus = tuple(
            GpuFacts(
                index=i, name=f"declared {gpu_mem_gib:g} GiB GPU", total_bytes=size, free_bytes=size
            )
            for i in range(gpu_count)
        )
        facts = replace(facts, gpus=gpus, gpu_source="declared")
    if ram_gib is not None:
        ram = int(ram_gib * GIB)
        facts = replace(
            facts, ram_total_bytes=ram, ram_available_bytes=ram, shm_free_bytes=ram // 2
        )
    return facts
