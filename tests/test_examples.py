"""Issue #38: every file under examples/ runs in a test as written, so a README or docs
example cannot rot: each config's own `plan` command (from its header, byte for byte)
against a Hugging Face hub on loopback serving the repos it names; the offline example's
planning on the hardware it declares; the openai client example against a real server in
tests/e2e/test_readme_journey.py."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.hub_server import Hub, Repo, serve_hub
from tests.model.test_hub import _cli
from tests.shapes import LLAMA3_8B, QWEN25_7B
from vllm_offload.config import load

REPO_ROOT = Path(__file__).parents[1]
EXAMPLES = REPO_ROOT / "examples"
CONFIGS = sorted(p.name for p in EXAMPLES.glob("*.toml"))
# where each example that is not a config runs
RUN_ELSEWHERE = {
    "cpu_offload_example.py": "tests/test_examples.py",
    "openai_client_example.py": "tests/e2e/test_readme_journey.py",
}


def test_every_example_runs_somewhere() -> None:
    """A new file under examples/ needs a test: a config here, a script named above."""
    scripts = sorted(p.name for p in EXAMPLES.iterdir() if p.suffix != ".toml")
    assert scripts == sorted(RUN_ELSEWHERE)
    for script, test in RUN_ELSEWHERE.items():
        assert script in (REPO_ROOT / test).read_text(), (script, test)


def header_command(config: Path) -> list[str]:
    (command,) = re.findall(r"^# `(vllm-offload plan [^`]+)`", config.read_text(), re.M)
    return shlex.split(command)[1:]


def hub_ids(config: Path) -> list[str]:
    loaded = load(config)
    paths = [m.path for m in loaded.models] if loaded.models else [loaded.model.path]
    assert all(p and not p.startswith("/") for p in paths), "examples name hub ids"
    return [p for p in paths if p]


def shape(repo: str, llama: dict[str, Any]) -> dict[str, Any]:
    return QWEN25_7B if repo.startswith("Qwen/Qwen2.5-") else llama


def plan_from_loopback_hub(config: Path, argv: list[str], tmp_path: Path) -> None:
    """`vllm-offload ARGV --json` with a hub on loopback serving (as 8B-shaped models, a
    Qwen2.5-7B's shape for Qwen repos) the repos ``config`` names: it plans, and the only
    thing it says cannot start is a model not pulled yet."""
    llama = dict(LLAMA3_8B, max_position_embeddings=131072)
    repos = {
        repo: Repo(files={"config.json": json.dumps(shape(repo, llama)).encode()})
        for repo in hub_ids(config)
    }
    with serve_hub(Hub(repos=repos)) as endpoint:
        env = {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "NO_PROXY": "127.0.0.1",
            "PYTHONPATH": str(REPO_ROOT),
        }
        planned = _cli(env, *argv, "--json")
    # it plans; the one thing it says cannot start yet is the model not pulled (exit 2)
    assert planned.returncode in (0, 2), planned.stderr
    plans = json.loads(planned.stdout)
    problems = plans.get("problems", []) + [
        p for plan in plans.get("models", {}).values() for p in plan.get("problems", [])
    ]
    assert problems, "a hub id not pulled yet cannot start"
    for problem in problems:
        assert problem["field"].endswith("path"), problem
        assert "is not downloaded yet" in problem["message"], problem


@pytest.mark.parametrize("name", CONFIGS)
def test_each_example_config_plans_as_written(name: str, tmp_path: Path) -> None:
    """The header's command, run in the clone as written."""
    plan_from_loopback_hub(EXAMPLES / name, header_command(EXAMPLES / name), tmp_path)


DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TOML_BLOCKS = [
    (str(doc.relative_to(REPO_ROOT)), block)
    for doc in DOCS
    for block in re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S)
]


@pytest.mark.parametrize(("doc", "block"), TOML_BLOCKS, ids=[d for d, _ in TOML_BLOCKS])
def test_each_docs_config_block_is_a_config_that_plans(
    doc: str, block: str, tmp_path: Path
) -> None:
    """Every ```toml block of the README and docs/ is a valid config as written; one that
    names models plans them for a 24 GB card (they named /models/... folders no reader
    has)."""
    config = tmp_path / "config.toml"
    config.write_text(block)
    loaded = load(config)
    if loaded.models or loaded.model.path:
        argv = ["plan", "--config", str(config), "--gpu-mem-gib", "24", "--ram-gib", "128"]
        plan_from_loopback_hub(config, argv, tmp_path)


def test_the_offline_example_plans_on_the_gpu_it_needs(tmp_path: Path) -> None:
    """examples/cpu_offload_example.py needs an NVIDIA GPU to run vLLM; its plan (what it
    hands vLLM) is made here on a declared 24 GB card."""
    from examples import cpu_offload_example as example

    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    plan = example.tier_plan(model, "auto", make_host(24, ram_gib=64))
    options = example.llm_options(plan)  # what it hands LLM(...), read off the plan
    assert plan.kv.backend == "native" and plan.cpu_tier.bytes > 0
    assert options["max_model_len"] == plan.length.max_model_len <= plan.gpu.kv_pool_tokens
    assert options["block_size"] == plan.kv.block_tokens
    extra = options["kv_transfer_config"].kv_connector_extra_config
    assert extra == {"cpu_bytes_to_use": plan.cpu_tier.bytes}
