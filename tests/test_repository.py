"""Properties of the checkout itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_venv_symlink_is_ignored(tmp_path: Path) -> None:
    """Issue #14: `/.venv/` matched only a directory, so a `.venv` symlink (to a venv kept
    elsewhere) showed up as a new file to commit."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".venv").symlink_to(tmp_path / "elsewhere")
    ignored = subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", ".venv"])
    assert ignored.returncode == 0
