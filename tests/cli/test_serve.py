from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from vllm_offload import launch_spec, run_vllm
from vllm_offload.cli import main


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[launch_spec.LaunchSpec]:
    """Records every attempt to start vLLM instead of starting it."""
    calls: list[launch_spec.LaunchSpec] = []
    monkeypatch.setattr(run_vllm, "run", calls.append)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    return calls


def serve(*args: str) -> int:
    return main(["serve", *args])


def test_dry_run_prints_command_and_kv_config(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve(
        "--model",
        str(demo_dir),
        "--gpu-mem-gib",
        "24",
        "--ram-gib",
        "128",
        "--kv-offload-cpu-tier-gib",
        "8",
        "--dry-run",
        "--",
        "--enforce-eager",
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert started == []
    command, kv_json = out.split("\n", 1)
    env, argv = shlex.split(command), []
    while "=" in env[0]:  # the environment the launcher sets, printed before the command
        argv.append(env.pop(0))
    assert argv == [
        "TORCHINDUCTOR_DETERMINISTIC=1",  # server.reproducible, on by default
        f"VLLMOFFLOAD_CPU_TIER_RAM_RESERVE_BYTES={int(12.8 * (1 << 30))}",
        "VLLM_TRITON_FORCE_FIRST_CONFIG=1",
    ]
    argv = env
    assert "--no-enable-flashinfer-autotune" in argv
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert f"--model={demo_dir}" in argv
    assert argv[-1] == "--enforce-eager"
    kv = json.loads(kv_json)
    assert kv["kv_connector_extra_config"]["cpu_bytes_to_use"] == 8 << 30
    written = next(a for a in argv if a.startswith("--kv-transfer-config="))
    assert json.loads(written.split("=", 1)[1]) == kv
    assert "KV offload backend: native" in err
    assert "GPU KV pool" in err


def test_dry_run_exit_code_reflects_preflight(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve(
        "--model",
        str(demo_dir),
        "--gpu-mem-gib",
        "24",
        "--ram-gib",
        "32",
        "--kv-offload-cpu-tier-gib",
        "64",
        "--dry-run",
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert "--kv-transfer-config" in out  # printed before the checks
    assert "error: kv_offload.cpu_tier_gib" in err
    assert started == []


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--model", "/nonexistent/model"], "/nonexistent/model: no such directory"),
        (
            ["--kv-offload-backend", "native"],
            "kv_offload.backend: CPU KV offload needs an NVIDIA GPU",
        ),
        (
            ["--gpu-mem-gib", "24", "--ram-gib", "16", "--kv-offload-cpu-tier-gib", "100"],
            "kv_offload.cpu_tier_gib",
        ),
        (["--server-port", "99999"], "server.port"),
        (["--gpu-memory-utilization", "2"], "gpu.memory_utilization"),
        (["--swap-space", "4"], "--swap-space: vLLM removed swap_space"),
        (["--", "--swap-space", "4"], "--swap-space: vLLM removed swap_space"),
        (
            ["--model-max-model-len", "100000000", "--gpu-kv-cache-memory-bytes", "67108864"],
            "model.max_model_len",
        ),
        (["--gpu-mem-gib", "-3"], "--gpu-mem-gib"),
        (["--server-api-key-file", "/nonexistent/key"], "server.api_key_file"),
    ],
)
def test_preflight_errors_exit_2_and_start_nothing(
    demo_dir: Path,
    started: list[launch_spec.LaunchSpec],
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    field: str,
) -> None:
    argv = ["--model", str(demo_dir), *args] if args[0] != "--model" else args
    if "--" in argv:  # keep passthrough last
        cut = argv.index("--")
        argv = [*argv[:cut], *argv[cut + 3 :], *argv[cut : cut + 3]]
    assert serve(*argv) == 2
    assert field in capsys.readouterr().err
    assert started == []


@pytest.mark.parametrize(
    "passthrough",
    [
        ["--max-model-len", "8192"],
        ["--max_model_len=8192"],
        ["--max-model", "8192"],
        ["--block-size", "16"],
        ["--port", "9"],
        ["-tp", "2"],
        ["--api-server-count", "2"],
        ["--kv-transfer-config.kv_connector", "X"],
    ],
)
def test_passthrough_of_a_flag_the_launcher_writes_is_refused(
    demo_dir: Path,
    started: list[launch_spec.LaunchSpec],
    capsys: pytest.CaptureFixture[str],
    passthrough: list[str],
) -> None:
    """Issue #13: vLLM keeps the last of a repeated flag, so `-- --max-model-len 8192` after
    the planner's 8,064 served a length the pool cannot hold (and passed --dry-run)."""
    code = serve(
        "--model",
        str(demo_dir),
        "--gpu-kv-cache-memory-bytes",
        "1073741824",
        "--dry-run",
        "--",
        *passthrough,
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert f"error: extra_args: {passthrough[0]} is " in err
    assert out == ""  # refused before anything is planned or printed
    assert started == []


def test_dry_run_of_a_gpu_config_on_a_cpu_host_prints_it_then_refuses(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #14: a GPU host's config can be inspected anywhere; it stopped before
    printing anything."""
    code = serve("--model", str(demo_dir), "--kv-offload-backend", "native", "--dry-run")
    out, err = capsys.readouterr()
    assert code == 2
    assert "--kv-transfer-config" in out and '"kv_connector": "OffloadingConnector"' in out
    assert "error: kv_offload.backend: CPU KV offload needs an NVIDIA GPU" in err
    assert started == []


def test_a_taken_port_is_refused_before_vllm_loads(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #15: vLLM found it only after ~15 s of imports."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert serve("--model", str(demo_dir), "--port", str(port)) == 2
    assert f"error: server.port: 127.0.0.1:{port} is taken" in capsys.readouterr().err
    assert started == []


def test_not_a_model_dir(
    tmp_path: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    assert serve("--model", str(tmp_path)) == 2
    assert "not a Hugging Face model directory (no config.json)" in capsys.readouterr().err
    assert started == []


def test_bad_config_file(
    tmp_path: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[kv_offload]\nnum_cpu_block = 3\n")
    assert serve("--config", str(path)) == 2
    assert "kv_offload.num_cpu_block: unknown key" in capsys.readouterr().err
    assert started == []


def test_serve_starts_with_the_built_spec(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], tmp_path: Path
) -> None:
    key = tmp_path / "key"
    key.write_text("k-123")
    key.chmod(0o600)
    assert serve("--model", str(demo_dir), "--port", "8111", "--server-api-key-file", str(key)) == 0
    (spec,) = started
    assert spec.option("--port") == "8111"
    assert spec.env["VLLM_API_KEY"] == "k-123"


def test_config_show_merges_file_and_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server]\nport = 9001\n[kv_offload]\ncpu_tier_gib = 4\n")
    assert main(["config", "show", "--config", str(path), "--host", "0.0.0.0", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["server"] == {
        "host": "0.0.0.0",
        "port": 9001,
        "api_key_file": "",
        "reproducible": True,
    }
    assert shown["kv_offload"]["cpu_tier_gib"] == 4.0


def test_every_commands_help_renders(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats help texts with %: the disk tier's '5 %' broke `serve --help`."""
    from vllm_offload.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        assert sub.format_help(), name
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    assert "(5 %, at least 10 GiB)" in capsys.readouterr().out


def test_dry_run_with_a_host_extension_on_a_cpu_host(
    demo_dir: Path, started: list[launch_spec.LaunchSpec], capsys: pytest.CaptureFixture[str]
) -> None:
    code = serve(
        "--model",
        str(demo_dir),
        "--kv-offload-backend",
        "none",
        "--kv-offload-host-extension-gib",
        "1",
        "--kv-offload-spilled-step-share",
        "0.25",
        "--dry-run",
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert (
        '\'--additional-config={"kv_host_extension_bytes":1073741824,'
        '"kv_spilled_step_share":0.25}\'' in out
    )
    assert "--scheduler-cls=vllm_offload.vllm_ext.fair_scheduler.FairScheduler" in out
    assert "error: kv_offload.host_extension_gib: the host extension maps host RAM" in err
    assert started == []


def test_the_default_model_runs_in_float32_wherever_it_is_named(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #56: named by its path or in [[models]] the default model ran in bfloat16 (its
    float32 rule held for no model.path only) and answered the capital question with
    garbage. A folder is the default model by its source.json (the pinned GGUF)."""
    import shutil

    from vllm_offload.model import real as real_model

    model = tmp_path / "smollm2"
    shutil.copytree(demo_dir, model)
    (model / "source.json").write_text(json.dumps({"gguf_sha256": real_model.GGUF_SHA256}))
    assert serve("--model", str(model), "--dry-run") == 0
    assert "--dtype=float32" in capsys.readouterr().out
    assert serve("--model", str(model), "--model-dtype", "bfloat16", "--dry-run") == 0
    assert "--dtype=bfloat16" in capsys.readouterr().out  # said so: as said
    config = tmp_path / "two.toml"
    config.write_text(
        f'[[models]]\npath = "{model}"\nserved_name = "a"\n'
        f'[[models]]\npath = "{demo_dir}"\nserved_name = "b"\n'
        f'[residency]\nruntime_dir = "{tmp_path / "run"}"\n'
    )
    assert serve("--config", str(config), "--dry-run") == 0
    assert capsys.readouterr().out.count("--dtype=float32") == 1  # the default model's only
    assert serve("--model", str(demo_dir), "--dry-run") == 0
    assert "--dtype" not in capsys.readouterr().out
