"""kv_offload.backend = lmcache refused where LMCache cannot serve: not installed (as on
this CPU host), or installed with compiled ops that do not load with this torch (LMCache
then only logs it and copies with slow torch code). The real LMCache 0.5.6 needs torch 2.13
and CUDA: it is proven on the GPU host (benchmarks/gpu/release.sh lmcache); here a package
of the same name stands in for the two broken installs, run by the same child Python."""

from __future__ import annotations

import functools
import os
import venv
from pathlib import Path

import pytest

from vllm_offload import launch_spec, preflight, run_vllm
from vllm_offload.cli import main


def fake_lmcache(root: Path, ops_source: str) -> dict[str, str]:
    """An `lmcache` 0.5.6 on PYTHONPATH whose `cuda_ops` module runs ``ops_source``."""
    package = root / "lmcache"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "cuda_ops.py").write_text(ops_source)
    info = root / "lmcache-0.5.6.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lmcache\nVersion: 0.5.6\n")
    return {**os.environ, "PYTHONPATH": str(root)}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with no packages: LMCache is not installed there, wherever this runs."""
    directory = tmp_path_factory.mktemp("bare")
    venv.create(directory, with_pip=False)
    return str(directory / "bin" / "python")


def test_not_installed_names_the_install(bare_python: str) -> None:
    problem = preflight.lmcache_problem(dict(os.environ), bare_python)
    assert problem is not None
    assert "LMCache is not installed" in problem
    assert "make install LMCACHE=1" in problem and "kv_offload.backend = native" in problem


def test_ops_built_for_another_torch_are_refused(tmp_path: Path) -> None:
    symbol = "undefined symbol: _ZN3c1019NotImplementedErrorC1ENS_14SourceLocationESs"
    environ = fake_lmcache(tmp_path, f"raise ImportError({symbol!r})")
    problem = preflight.lmcache_problem(environ)
    assert problem is not None
    assert "LMCache 0.5.6's compiled ops do not load with this torch" in problem
    assert symbol in problem


def test_loading_ops_pass(tmp_path: Path) -> None:
    environ = fake_lmcache(tmp_path, "")
    assert preflight.lmcache_problem(environ) is None


def test_serve_refuses_with_exit_2(
    demo_dir: Path,
    bare_python: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through `serve` on a declared GPU host: exit 2 naming the field, nothing started
    (the check asks the bare Python, where LMCache is missing whatever this host has)."""
    started: list[launch_spec.LaunchSpec] = []
    monkeypatch.setattr(run_vllm, "run", started.append)
    asks_bare = functools.partial(preflight.lmcache_problem, python=bare_python)
    monkeypatch.setattr(preflight, "lmcache_problem", asks_bare)
    code = main(
        [
            "serve",
            "--model",
            str(demo_dir),
            "--gpu-mem-gib",
            "24",
            "--ram-gib",
            "64",
            "--kv-offload-backend",
            "lmcache",
            "--kv-offload-cpu-tier-gib",
            "4",
        ]
    )
    assert code == 2
    assert "kv_offload.backend: LMCache is not installed" in capsys.readouterr().err
    assert started == []
