"""`plan` with several [[models]] exits as `serve` would (issue #45, item 7: a `return 0`
in its several-models branch went unnoticed)."""

from __future__ import annotations

import json
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


def test_the_turn_flag_takes_auto_or_seconds_and_plan_json_says_what_it_resolved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--residency-min-resident-s: 'auto' (the planner's choice: level-1 sleep on this
    24 GB card, so 0), a number kept, anything else refused naming the key (exit 2)."""
    config = str(two_models(tmp_path, 8))
    plan = ["plan", "--config", config, "--gpu-mem-gib=24", "--ram-gib=128", "--json"]
    for flag, resolved in (("auto", 0.0), ("2.5", 2.5), ("0", 0.0)):
        assert main([*plan, f"--residency-min-resident-s={flag}"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["max_resident"], out["min_resident_s"]) == (1, resolved)
    assert main([*plan, "--residency-min-resident-s=soon"]) == 2
    assert 'residency.min_resident_s: "soon" is neither "auto" nor a number of seconds' in (
        capsys.readouterr().err
    )
