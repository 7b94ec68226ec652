"""Issue #29, items 1 and 2: config values other than extra_args became vLLM options. The
config refuses what could be read as an option, the launcher writes ``--flag=value``
tokens, and vLLM's own parser reads the final command line back before anything starts
(argv_check), refusing it (exit 2) where an owned field differs from the plan."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from vllm_offload import argv_check, config, launch, launch_spec, run_vllm
from vllm_offload.config import ConfigError, DeploymentConfig, with_overrides
from vllm_offload.config.schema import model_name
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import make_plan

# Values an attacker sent through PUT /api/config, and ones vLLM's parser treats specially:
# a dotted option takes the next token, "=" splits, "-tp2" is a short option with its value.
NASTY = [
    "--trust-remote-code.x",
    "--host",
    "-x",
    "--host=0.0.0.0",
    "-tp2",
    "--model.x",
    "--api-key",
    "a.b",
    "x y",
    '{"a":1}',
    "--kv-transfer-config.kv_connector",
    "=",
    "--help",
    "--config",
    "-",
    "--",
    "visual",
]


def string_fields() -> list[tuple[str, bool]]:
    """Every string and list-of-strings key of the config, found from the schema; whether
    it is a list."""
    keys = [("extra_args", True)]
    for section, model in config.SECTIONS.items():
        for key, info in model.model_fields.items():
            if info.annotation in (str, list[str]):
                keys.append((f"{section}.{key}", info.annotation == list[str]))
    return keys


def build(
    model: Path, overrides: dict[str, Any]
) -> tuple[DeploymentConfig, launch_spec.LaunchSpec]:
    cfg = with_overrides(DeploymentConfig(), {"model.path": str(model), **overrides})
    plan = make_plan(cfg, model_facts.read(model), make_host(24), "cuda")
    return cfg, launch.build(cfg, plan, model)


def vllm_reads(args: tuple[str, ...]) -> dict[str, Any]:
    return dict(vars(argv_check._parser().parse_args(list(args))))


def test_the_attacks_of_the_issue_are_refused_by_the_config(demo_dir: Path) -> None:
    for key, value in [
        ("model.served_name", "--trust-remote-code.x"),
        (
            "weights_offload.params",
            ["--model", "/elsewhere", "--trust-remote-code", "--host", "0.0.0.0"],
        ),
        ("server.host", "--trust-remote-code.x"),
        ("model.path", "--trust-remote-code"),
    ]:
        with pytest.raises(ConfigError) as info:
            with_overrides(DeploymentConfig(), {key: value})
        assert info.value.field == key


def test_the_old_command_line_is_refused_by_vllms_own_parser(demo_dir: Path) -> None:
    """The served name of the issue in the layout the launcher used to write: vLLM read
    trust_remote_code = True and no host from it. The check refuses it (exit 2)."""
    _cfg, spec = build(demo_dir, {"model.served_name": "m", "extra_args": ["--enforce-eager"]})
    old: list[str] = []
    for token in spec.args:  # each option as two tokens, as the launcher wrote them then
        old += token.split("=", 1) if token.startswith("--") else [token]
    old[old.index("--served-model-name") + 1] = "--trust-remote-code.x"
    read = vllm_reads(tuple(old))
    assert read["trust_remote_code"] is True and read["host"] is None  # the attack
    with pytest.raises(launch_spec.PreflightError) as info:
        argv_check.check(dataclasses.replace(spec, args=tuple(old)))
    assert info.value.exit_code == 2 and info.value.field == "server.host"
    assert "trust_remote_code = True" in info.value.message
    # weights_offload.params of the issue, appended after --cpu-offload-params unchecked
    _cfg, offload = build(
        demo_dir, {"weights_offload.cpu_gib": 0.001, "weights_offload.params": ["visual"]}
    )
    args = list(offload.args)
    at = args.index("visual")
    args[at + 1 : at + 1] = ["--model", "/elsewhere", "--trust-remote-code"]
    with pytest.raises(launch_spec.PreflightError) as info:
        argv_check.check(dataclasses.replace(offload, args=tuple(args)))
    assert info.value.field == "model.path"


@pytest.mark.parametrize(("key", "is_list"), string_fields())
def test_every_string_field_goes_through_the_check(
    key: str, is_list: bool, demo_dir: Path, tmp_path: Path
) -> None:
    """Each string field of the config, given each value: the config refuses it, or the
    command line built from it passes vLLM's own reading with every owned field as
    planned (model, host, port, served name, API key, trust_remote_code, KV transfer
    config, ...), and the check agrees."""
    for value in NASTY:
        model = demo_dir
        if key == "model.path":  # a model folder of that name: its name is the served name
            model = tmp_path / value.replace("/", "_")
            if value not in ("", ".", "..") and not model.exists():
                shutil.copytree(demo_dir, model)
        overrides: dict[str, Any] = {key: [value] if is_list else value}
        if key == "weights_offload.params":
            overrides["weights_offload.cpu_gib"] = 0.001
        if key == "model.path":
            overrides[key] = str(model)
        try:
            cfg, spec = build(model, overrides)
        except ConfigError:
            continue  # refused where the config is parsed
        try:
            argv_check.check(spec)
        except launch_spec.PreflightError:
            # The config refuses every value of its own fields that vLLM would misread;
            # left to the check: the administrator's extra_args, and a folder's name
            # (argparse drops a served name "--").
            assert key in ("extra_args", "model.path"), (key, value)
            continue
        read = vllm_reads(spec.args)
        alone = vllm_reads(spec.extra_args)
        assert read["model"] == str(model)
        assert read["host"] == cfg.server.host and read["port"] == cfg.server.port
        assert read["served_model_name"] == [model_name(cfg.model)]
        assert read["api_key"] is None  # the key goes through the environment only
        assert read["trust_remote_code"] == alone["trust_remote_code"]
        assert read["kv_transfer_config"].kv_connector == "OffloadingConnector"
        assert read["additional_config"] == alone["additional_config"]


def test_serve_refuses_a_command_line_vllm_would_misread(
    demo_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folder named "--" passes every config check, but argparse drops a served name
    "--": `serve --dry-run` and the start itself refuse it (exit 2) before vLLM runs."""
    import runpy

    from vllm_offload.cli import main

    model = tmp_path / "--"
    shutil.copytree(demo_dir, model)
    assert main(["serve", "--model", str(model), "--dry-run"]) == 2
    assert "error: model.served_name: vLLM's own parser reads" in capsys.readouterr().err
    ran: list[str] = []
    monkeypatch.setattr(runpy, "run_module", lambda name, **_: ran.append(name))
    monkeypatch.setattr(os, "environ", dict(os.environ))  # run_vllm.run sets the spec's
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    _cfg, spec = build(model, {})
    with pytest.raises(launch_spec.PreflightError):
        run_vllm.run(spec)
    assert ran == []
    _cfg, fine = build(demo_dir, {})
    run_vllm.run(fine)
    assert ran == ["vllm.entrypoints.openai.api_server"]
