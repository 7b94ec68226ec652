"""`plan` with several [[models]] exits as `serve` would (issue #45, item 7: a `return 0`
in its several-models branch went unnoticed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload.cli import main
from vllm_offload.config import parse, save


def two_models(tmp_path: Path, coder_tier_gib: float) -> Path:
    models = [
        {"path": str(write_shape(tmp_path / n, LLAMA3_8B)), "served_name": n}
        for n in ("chat", "coder")
    ]
    models[1]["kv_offload"] = {"cpu_tier_gib": coder_tier_gib}
    path = tmp_path / "config.toml"
    save(parse({"models": models, "residency": {"runtime_dir": str(tmp_path / "run")}}), path)
    return path


def test_several_models_exit_0_when_they_can_start_and_2_when_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = ["--gpu-mem-gib", "24", "--ram-gib", "128"]
    assert main(["plan", "--config", str(two_models(tmp_path, 8)), *host]) == 0
    assert "cannot start" not in capsys.readouterr().out
    assert main(["plan", "--config", str(two_models(tmp_path, 500)), *host]) == 2
    out = capsys.readouterr().out
    assert "cannot start: models[1].kv_offload.cpu_tier_gib: 'coder'" in out
    assert main(["plan", "--config", str(two_models(tmp_path, 500)), *host, "--json"]) == 2
