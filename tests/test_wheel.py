"""Issue #30: a wheel that installs. Built from this checkout and installed (not editable)
into a fresh venv, the package must find its patch series and unit templates as package
data: `patch status` and `install-service --dry-run` run from there, outside the tree.
The fresh venv borrows this venv's third-party packages (a .pth line after its own
site-packages), so no download is needed; vllm_offload itself comes from the wheel."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(work / "dist"),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = (work / "dist").glob("vllm_offload-*.whl")
    env_dir = work / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            site.strip(),
            str(wheel),
        ],
        check=True,
    )
    (Path(site.strip()) / "zz-borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env_dir


def run(env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "vllm_offload", *args],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=120,
    )


def test_the_wheel_is_what_runs(fresh: Path) -> None:
    where = subprocess.run(
        [str(fresh / "bin" / "python"), "-c", "import vllm_offload; print(vllm_offload.__file__)"],
        capture_output=True,
        text=True,
        cwd="/",
        check=True,
    ).stdout
    assert str(fresh) in where and str(REPO) not in where


def test_patch_status_reads_the_series_from_the_wheel(fresh: Path) -> None:
    site = Path(sysconfig.get_path("purelib"))  # this venv's vLLM, patched by make install
    done = run(fresh, "patch", "status", "--site", str(site))
    assert done.returncode == 0, done.stderr
    assert ": applied" in done.stdout and "0001-CPU-block-accounting.patch" in done.stdout


def test_install_service_renders_the_templates_from_the_wheel(fresh: Path) -> None:
    done = run(fresh, "install-service", "--dry-run", "--user", "root")
    assert done.returncode == 0, done.stderr
    assert "ExecStart=" in done.stdout and "polkit.addRule" in done.stdout
