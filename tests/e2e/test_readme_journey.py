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

from tests.e2e.server import Server
from tests.hub_server import Hub, serve_hub
from tests.test_hub import _cli, _repo
from vllm_offload import real_model

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
