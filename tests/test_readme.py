"""The front page's commands as written (issue #38, item 7): every `vllm-offload` line in a
shell block of README.md is one the CLI takes (its subcommand and flags exist), and each
`plan` that names only this repository's files runs and exits 0."""

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
