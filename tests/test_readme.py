"""The front page's commands as written (issue #38, item 7): every `vllm-offload` line in a
shell block of README.md is one the CLI takes (its subcommand and flags exist), and each
`plan` that names only this repository's files runs and exits 0; "Get a model" runs
against a hub on loopback."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vllm_offload.cli import build_parser, main

ROOT = Path(__file__).parents[1]
SHELL_BLOCK = re.compile(r"```sh\n(.*?)```", re.S)


def commands(markdown: str) -> list[list[str]]:
    """Each `vllm-offload ...` (or `.venv/bin/vllm-offload ...`) command of the shell
    blocks, continuation lines joined, comments and `sudo` dropped."""
    found = []
    for block in SHELL_BLOCK.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            if "vllm-offload " not in line:  # curl's JSON spans lines
                continue
            words = shlex.split(line, comments=True)
            words = words[1:] if words[:1] == ["sudo"] else words
            if words and words[0].endswith("vllm-offload"):
                found.append(words[1:])
    return found


README = commands((ROOT / "README.md").read_text())


def test_the_readme_shows_commands() -> None:
    assert {c[0] for c in README} >= {"plan", "pull", "serve", "install-service"}


@pytest.mark.parametrize("argv", README, ids=lambda argv: " ".join(argv)[:60])
def test_every_readme_command_is_one_the_cli_takes(argv: list[str]) -> None:
    args, unknown = build_parser().parse_known_args(argv)
    assert unknown == [] and args.command == argv[0]


@pytest.mark.parametrize(
    "argv",
    [c for c in README if c[0] == "plan" and "benchmarks/models/" in " ".join(c)],
    ids=lambda argv: " ".join(argv)[:60],
)
def test_each_local_plan_runs_as_written(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0
    assert "GPU KV pool" in capsys.readouterr().out


HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+(@[\w.-]+)?$")
HUB_COMMANDS = [
    c for c in README if c[0] in ("plan", "pull") and any(HUB_ID.match(w) for w in c[1:])
]


def test_the_readme_hub_commands_run_as_written(tmp_path: Path) -> None:
    """ "Get a model" in order, as written, against a hub on loopback serving the ids it
    names: `plan` reads the hub without a download (it may say only that the model is
    not pulled yet), `pull` fetches, and `plan` then has nothing left to refuse."""
    import json
    import os

    from tests.hub_server import Hub, serve_hub
    from tests.model.test_hub import _cli, _repo

    assert [c[0] for c in HUB_COMMANDS] == ["plan", "pull"]
    ids = {w for c in HUB_COMMANDS for w in c[1:] if HUB_ID.match(w)}
    with serve_hub(Hub(repos={i: _repo() for i in ids})) as endpoint:
        env = {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "NO_PROXY": "127.0.0.1",
            "PYTHONPATH": str(ROOT),
        }
        plan, pull = HUB_COMMANDS
        before = _cli(env, *plan, "--json")
        assert before.returncode in (0, 2), before.stderr
        problems = json.loads(before.stdout)["problems"]
        assert all("is not downloaded yet" in p["message"] for p in problems), problems
        fetched = _cli(env, *pull)
        assert fetched.returncode == 0, fetched.stderr
        after = _cli(env, *plan)
        assert after.returncode == 0, after.stdout + after.stderr
        assert "GPU KV pool" in after.stdout
