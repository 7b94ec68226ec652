"""Finding vLLM and its version without importing it."""

from __future__ import annotations

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
