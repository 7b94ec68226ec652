"""Issue #38, item 6: messages for people with vLLM habits. Each names what was meant."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from vllm_offload import run_vllm
from vllm_offload.cli import build_parser, main
from vllm_offload.config import LAUNCHER_FLAGS

LLAMA_8B = Path(__file__).parents[2] / "benchmarks/models/llama-3.1-8b"
# vLLM flags the launcher owns that `plan` also takes as they are (--model, --port, and
# --gpu-memory-utilization, whose config key spells the same).
_PLAN = build_parser()._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
ACCEPTED = set(_PLAN._option_string_actions)


def config_flag(key: str) -> str:
    return "--" + key.replace(".", "-").replace("_", "-")


@pytest.mark.parametrize("flag", sorted(set(LAUNCHER_FLAGS) - ACCEPTED))
def test_a_vllm_flag_the_launcher_owns_names_its_config_flag(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", flag, "4096"]) == 2
    err = capsys.readouterr().err
    key = LAUNCHER_FLAGS[flag]
    assert f"{flag}: vLLM's flag; vllm-offload writes it from {key}" in err
    if "." in key:
        assert f"did you mean `{config_flag(key)}" in err


def test_the_issues_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-model-len", "4096"]) == 2
    err = capsys.readouterr().err
    assert "did you mean `--model-max-model-len 4096`" in err


def test_a_misspelt_flag_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-memory-utilisation", "0.8"]) == 2
    assert "did you mean `--gpu-memory-utilization`" in capsys.readouterr().err


def test_another_vllm_flag_is_shown_where_it_goes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--enforce-eager"]) == 2
    assert "vLLM's own flags go after `--`: `vllm-offload serve -- --enforce-eager`" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[model]\nmax_len = 4096\n", "model.max_len: unknown key; did you mean max_model_len?"),
        (
            "[gpu]\nmax_model_len = 4096\n",
            "gpu.max_model_len: unknown key; it belongs in [model] (model.max_model_len)",
        ),
        (
            "[weight_offload]\ncpu_gib = 4\n",
            "weight_offload: unknown key; did you mean [weights_offload]?",
        ),
        (
            '[model]\nmax_model_len = "4k"\n',
            'model.max_model_len: "4k" is neither "auto" nor a whole number of tokens (e.g. 4096)',
        ),
        (
            '[residency]\nmin_resident_s = "soon"\n',
            'residency.min_resident_s: "soon" is neither "auto" nor a number of seconds',
        ),
        (
            "[residency]\nmin_resident_s = -1\n",
            "residency.min_resident_s: must be 0 to 3600 seconds, or 'auto'",
        ),
    ],
)
def test_config_mistakes_name_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], toml: str, message: str
) -> None:
    (tmp_path / "c.toml").write_text(toml)
    assert main(["plan", "--config", str(tmp_path / "c.toml")]) == 2
    assert message in capsys.readouterr().err


def test_an_entrys_missing_folder_names_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.toml").write_text(
        f'[[models]]\npath = "{LLAMA_8B}"\nserved_name = "chat"\n'
        f'[[models]]\npath = "{tmp_path / "coder"}"\nserved_name = "coder"\n'
    )
    assert main(["plan", "--config", str(tmp_path / "c.toml"), "--gpu-mem-gib", "80"]) == 2
    err = capsys.readouterr().err
    assert f"error: models[1].path: 'coder': {tmp_path / 'coder'}: no such directory" in err


def test_listening_beyond_loopback_without_a_key_warns(
    demo_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_vllm, "run", lambda spec: None)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    argv = ["serve", "--model", str(demo_dir), "--dry-run"]
    assert main([*argv, "--host", "0.0.0.0"]) == 0
    assert "warning: server.host 0.0.0.0 listens beyond this machine" in capsys.readouterr().err
    assert main([*argv, "--host", "127.0.0.1"]) == 0
    assert "listens beyond" not in capsys.readouterr().err


def test_the_manager_on_a_taken_port_says_what_serve_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["manager", "--config", str(config), "--port", str(port)]) == 2
    assert f"error: --port: 127.0.0.1:{port} is taken" in capsys.readouterr().err


def test_service_status_of_a_unit_not_installed_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without systemd (or without the unit) it said `inactive (dead)` and exited 0."""
    assert main(["service", "status", "--unit", "vllm-offload-test-absent"]) != 0
    err = capsys.readouterr().err
    assert "vllm-offload-test-absent.service is not installed" in err
    assert "install-service" in err
