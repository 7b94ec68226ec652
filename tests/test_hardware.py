"""Host probing where parts of the NVIDIA stack are missing."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_offload import hardware
from vllm_offload.cli import main


def test_no_pynvml_means_no_gpu(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #14: without nvidia-ml-py, probing raised ImportError after nvml_devices had
    tolerated it, so `serve --dry-run` crashed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now fails
    assert hardware.probe_gpus() == ()
    assert main(["serve", "--model", str(demo_dir), "--dry-run"]) == 0
    assert "--kv-cache-memory-bytes" in capsys.readouterr().out


class FakeNvml:
    """NVML as an H100 80GB's driver answers it: 81,559 MiB in all, 479 MiB of it reserved
    by the driver and firmware (CUDA's total: 81,080 MiB), 1 GiB in use."""

    MIB = 1 << 20
    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        pass

    def __init__(self, *, has_v2: bool) -> None:
        self.has_v2 = has_v2

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return 16

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> object:
        total, reserved, used = 81559 * self.MIB, 479 * self.MIB, 1024 * self.MIB
        if version is None:  # v1: the reserve counts as used
            return SimpleNamespace(total=total, free=total - reserved - used, used=reserved + used)
        if not self.has_v2:
            raise self.NVMLError("Function Not Found")
        return SimpleNamespace(total=total, reserved=reserved, free=total - reserved - used)


@pytest.mark.parametrize("has_v2", [True, False])
def test_a_gpus_total_is_cudas(monkeypatch: pytest.MonkeyPatch, has_v2: bool) -> None:
    """The planner budgets a share of the total vLLM does (CUDA's, without the driver's
    reserve): NVML's plain total made the fork case's plan 0.13 GiB too big on an H100 at
    a 0.27 share (benchmarks/results/fork-case-h100-vllm-0.33.0/fp8.log). A driver without
    NVML's v2 query still gives the plain figures."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(has_v2=has_v2))
    (gpu,) = hardware.probe_gpus()
    mib = FakeNvml.MIB
    assert gpu.total_bytes == (81080 if has_v2 else 81559) * mib
    assert gpu.free_bytes == 80056 * mib
    assert (gpu.pcie_generation, gpu.pcie_width) == (5, 16)
