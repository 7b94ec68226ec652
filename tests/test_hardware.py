"""Host probing where parts of the NVIDIA stack are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.fake_nvml import MIB, FakeNvml
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


@pytest.mark.parametrize("has_v2", [True, False])
def test_a_gpus_total_is_cudas(monkeypatch: pytest.MonkeyPatch, has_v2: bool) -> None:
    """The planner budgets a share of the total vLLM does (CUDA's, without the driver's
    reserve): NVML's plain total made the fork case's plan 0.13 GiB too big on an H100 at
    a 0.27 share (benchmarks/results/fork-case-h100-vllm-0.33.0/fp8.log). A driver without
    NVML's v2 query still gives the plain figures."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(has_v2=has_v2))
    (gpu,) = hardware.probe_gpus()
    mib = MIB
    assert gpu.total_bytes == (81080 if has_v2 else 81559) * mib
    assert gpu.free_bytes == 80056 * mib
    assert (gpu.pcie_generation, gpu.pcie_width) == (5, 16)
