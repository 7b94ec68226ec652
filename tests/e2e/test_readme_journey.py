"""Issue #38's acceptance: a newcomer on a CPU host follows the README's front page, start
to finish, as real processes — the default model served and asked as its openai snippet
asks, a model pulled from a Hugging Face hub (tests/hub_server.py on loopback) and planned
for a 24 GB card, two models planned together, and the service's dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from testkit.server import Server
from tests.hub_server import Hub, serve_hub
from tests.model.test_hub import _cli, _repo
from vllm_offload.bench.server_process import free_port
from vllm_offload.model import real as real_model

pytestmark = pytest.mark.e2e
NAME = real_model.DEFAULT_NAME  # what the README's snippets ask for


def test_the_readme_from_start_to_finish(tmp_path: Path, real_dir: Path) -> None:
    # `make serve` with no config, then the README's openai snippet.
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLMOFFLOAD_CACHE": str(real_dir.parent)}
    server = Server(["--model-served-name", NAME, "--", "--enforce-eager"], tmp_path, env=env)
    server.start()
    try:
        client_url = server.base_url + "/v1"
        client = openai.OpenAI(base_url=client_url, api_key="unused", timeout=300)
        out = client.chat.completions.create(
            model=NAME,
            temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
        )
        assert "Paris" in (out.choices[0].message.content or "")
        # examples/openai_client_example.py as its docstring runs it (plain and streamed)
        example = subprocess.run(
            [sys.executable, "examples/openai_client_example.py", "--base-url", client_url],
            cwd=Path(__file__).parents[2],
            env={**os.environ, "VLLM_API_KEY": "unused", "NO_PROXY": "127.0.0.1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert example.returncode == 0, example.stderr
        assert example.stdout.strip(), "the example printed no answer"
    finally:
        server.stop()
    # Issue #56 (4): the first start said its phases, and how long one takes.
    log = server.log_path.read_text(errors="replace")
    assert "vllm-offload: start: loading the weights" in log
    assert "vllm-offload: start: the engine is ready" in log
    assert "the first start of a model and its settings compiles it" in log

    hub = Hub(repos={"org/tiny": _repo()})
    with serve_hub(hub) as endpoint:
        cli_env = {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "NO_PROXY": "127.0.0.1",
            "VLLMOFFLOAD_CACHE": str(real_dir.parent),
            "PYTHONPATH": str(Path(__file__).parents[2]),
        }
        # "Get a model": pull, then plan it for a 24 GB card.
        pulled = _cli(cli_env, "pull", "org/tiny")
        assert pulled.returncode == 0, pulled.stderr
        planned = _cli(cli_env, "plan", "--model", "org/tiny", "--gpu-mem-gib", "24")
        assert planned.returncode == 0, planned.stdout + planned.stderr
        assert "GPU KV pool" in planned.stdout
        # "Several models": the default model and the pulled one, planned together.
        config = tmp_path / "two.toml"
        config.write_text(
            f'[[models]]\nserved_name = "{NAME}"\n[[models]]\npath = "org/tiny"\n'
            f'[residency]\nruntime_dir = "{tmp_path / "run"}"\n'
        )
        both = _cli(
            cli_env, "plan", "--config", str(config), "--gpu-mem-gib", "24", "--ram-gib", "128"
        )
        assert both.returncode == 0, both.stdout + both.stderr
        assert "org/tiny" in both.stdout and NAME in both.stdout
        # Issue #56 (1): the demo model runs in float32 wherever it is named
        by_path = _cli(cli_env, "serve", "--model", str(real_dir), "--dry-run")
        assert "--dtype=float32" in by_path.stdout, by_path.stdout + by_path.stderr
        engines = _cli(cli_env, "serve", "--config", str(config), "--dry-run")
        assert engines.stdout.count("--dtype=float32") == 1, engines.stdout + engines.stderr
        # (5) a refusal prints the plan of the fix it names, and says which
        too_long = ("--model-max-model-len", "5000000", "--model-allow-long-max-model-len", "true")
        refused = _cli(cli_env, "plan", "--model", "org/tiny", "--gpu-mem-gib", "24", *too_long)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert (
            "GPU KV pool" in refused.stdout
            and "cannot start: model.max_model_len" in refused.stdout
        )
        # (3) `load` with no front door running says so, not "one model is configured"
        load = _cli(cli_env, "load", "org/tiny")
        assert load.returncode == 1 and "no front door's control socket" in load.stderr
        # (2) `vllm-offload manager` as the README writes it, on a machine with no config
        home = tmp_path / "home"
        manager = subprocess.Popen(
            [sys.executable, "-m", "vllm_offload", "manager", "--port", str(free_port())],
            env={**cli_env, "HOME": str(home), "XDG_CONFIG_HOME": ""},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert manager.stderr is not None
            said = [manager.stderr.readline() for _ in range(3)]
            assert any("http://127.0.0.1:" in line for line in said), said
            assert (home / ".config/vllm-offload/config.toml").is_file()
        finally:
            manager.terminate()
            manager.wait(timeout=60)
        # "Run it as a service": the dry run, before anything is written.
        dry = _cli(
            cli_env,
            "install-service",
            "--user",
            "vllm-offload",
            "--dry-run",
            "--root",
            str(tmp_path / "root"),
        )
        assert dry.returncode in (0, 2), dry.stderr
        assert dry.stdout.startswith("install-service --dry-run: nothing is written")
        assert "not shown" in dry.stdout  # the manager's token is never printed
        assert not (tmp_path / "root").exists() or not any((tmp_path / "root").rglob("*.service"))
