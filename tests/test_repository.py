"""Properties of the checkout itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
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


def make_pip_sources(env: dict[str, str]) -> str:
    done = subprocess.run(
        ["make", "-s", "pip-sources"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


def torch_cpu_wheel(folder: Path) -> None:
    """A stand-in for the pinned torch CPU build, as a wheel folder of pip's would hold it."""
    pin = (ROOT / "requirements/cpu.txt").read_text().split("torch==", 1)[1].split()[0]
    folder.mkdir()
    with zipfile.ZipFile(folder / f"torch-{pin}-py3-none-any.whl", "w") as wheel:
        info = f"torch-{pin}.dist-info"
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {pin}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")


def test_make_install_adds_pytorchs_cpu_index_only_where_torch_cpu_is_missing(
    tmp_path: Path,
) -> None:
    """Issue #14: torch==2.13.0+cpu is on PyTorch's own index, not PyPI, so a stock pip
    could not install it. Where pip's configured sources have it (a wheel folder, as on the
    CI machine), that index is never asked; where they lack it, it is added."""
    (tmp_path / "index").mkdir()  # an index without torch's CPU build, as PyPI is
    stock = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": "",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_INDEX_URL": (tmp_path / "index").as_uri(),
    }
    assert make_pip_sources(stock) == "--extra-index-url https://download.pytorch.org/whl/cpu"
    torch_cpu_wheel(tmp_path / "wheels")
    assert make_pip_sources({**stock, "PIP_FIND_LINKS": str(tmp_path / "wheels")}) == ""


def test_the_seeds_entry_points_still_work(demo_dir: Path) -> None:
    """tools/ keeps the seed fork's two commands as shims over `vllm-offload serve` and
    `vllm-offload manager` (README, Layout)."""
    import sys

    serve = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools/vllm_cpu_offload_server.py"),
            "--model",
            str(demo_dir),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert serve.returncode == 0, serve.stderr
    assert "vllm.entrypoints.openai.api_server" in serve.stdout
    manager = subprocess.run(
        [sys.executable, str(ROOT / "tools/vllm_manager.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert manager.returncode == 0 and "--token-file" in manager.stdout
