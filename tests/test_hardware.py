"""Host probing where parts of the NVIDIA stack are missing."""

from __future__ import annotations

import sys
from pathlib import Path

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
