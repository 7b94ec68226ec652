"""NVML as a driver answers it, for GPUs that are not here: each GPU's name and memory
(MiB in all, MiB the driver and firmware reserve), for ``hardware.probe_gpus`` through
``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...))``."""

from __future__ import annotations

from types import SimpleNamespace

MIB = 1 << 20
H100 = ("NVIDIA H100 80GB HBM3", 81559, 479)
RTX_4090 = ("NVIDIA GeForce RTX 4090", 24564, 330)
A6000 = ("NVIDIA RTX A6000", 49140, 376)


class FakeNvml:
    """GPUs in index order, each 1 GiB in use; ``has_v2``: the driver has NVML's v2 memory
    query (the reserve apart), else the reserve counts as used."""

    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        pass

    def __init__(
        self, gpus: tuple[tuple[str, int, int], ...] = (H100,), *, has_v2: bool = True
    ) -> None:
        self.gpus = gpus
        self.has_v2 = has_v2

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.gpus[handle][0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> object:
        _name, total_mib, reserved_mib = self.gpus[handle]
        total, reserved, used = total_mib * MIB, reserved_mib * MIB, 1024 * MIB
        if version is None:  # v1: the reserve counts as used
            return SimpleNamespace(total=total, free=total - reserved - used, used=reserved + used)
        if not self.has_v2:
            raise self.NVMLError("Function Not Found")
        return SimpleNamespace(total=total, reserved=reserved, free=total - reserved - used)
