"""An engine that sleeps runs only with our sleep backend (issue #43): vLLM loads it through
our plugin's entry point, and without that it would warn and fall back to its own backend,
which keeps more host RAM than the plan counts. Removing the registration (the entry point
absent, or VLLM_PLUGINS leaving it out) is refused by `serve`'s preparation and by the
engine process itself, before vLLM starts."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_host
from tests.plan.test_box import two_models
from vllm_offload.box.prepare import prepare_box
from vllm_offload.config import parse
from vllm_offload.hardware import declared
from vllm_offload.launch_spec import LaunchSpec
from vllm_offload.vllm_ext import PLUGIN_GROUP, PLUGIN_NAME, PLUGIN_TARGET, plugin_missing
from vllm_offload.vllm_ext.knobs import (
    LAYERED_WAKE_WORKER,
    SLEEP_ARENA_ENV,
    SLEEP_KEEP_COPY_ENV,
)

OURS = importlib.metadata.EntryPoint(PLUGIN_NAME, PLUGIN_TARGET, PLUGIN_GROUP)
OTHER = importlib.metadata.EntryPoint("lora_filesystem_resolver", "x:y", PLUGIN_GROUP)


def test_the_registration_is_what_vllm_loads() -> None:
    assert plugin_missing({}) is None  # this venv installs the package: vLLM loads it
    assert plugin_missing({}, [OURS, OTHER]) is None
    absent = plugin_missing({}, [OTHER])
    assert absent is not None and "install the package" in absent
    assert plugin_missing({"VLLM_PLUGINS": "vllm_offload,x"}, [OURS]) is None
    left_out = plugin_missing({"VLLM_PLUGINS": "lora_filesystem_resolver"}, [OURS])
    assert left_out is not None and "VLLM_PLUGINS" in left_out


def test_serve_refuses_a_sleeping_set_without_the_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = declared(make_host(None), gpu_mem_gib=80, ram_gib=256)
    config = parse(two_models(tmp_path, max_resident=1))
    assert prepare_box(config, host, {}, None).problems == ()
    excluded = prepare_box(config, host, {"VLLM_PLUGINS": "other"}, None)
    assert [p.field for p in excluded.problems] == ["residency.idle"]
    assert "VLLM_PLUGINS" in excluded.problems[0].message
    # the package's dist-info gone (a run from a source tree): no entry point at all
    real = importlib.metadata.entry_points

    def without_ours(**select: str) -> importlib.metadata.EntryPoints:
        found = real(**select)
        return importlib.metadata.EntryPoints(e for e in found if e.name != PLUGIN_NAME)

    monkeypatch.setattr(importlib.metadata, "entry_points", without_ours)
    (problem,) = prepare_box(config, host, {}, None).problems
    assert problem.field == "residency.idle" and "install the package" in problem.message
    stopping = parse(two_models(tmp_path, max_resident=1, idle="stop"))
    assert prepare_box(stopping, host, {}, None).problems == ()  # nothing sleeps


def test_the_engine_process_refuses_to_start_without_it(tmp_path: Path) -> None:
    """The engine child, as the front door runs it, with our plugin left out of the ones
    vLLM loads: exit 2 naming why, before vLLM is imported."""
    spec = LaunchSpec(
        args=("--model=/nonexistent",), env={SLEEP_ARENA_ENV: "1"}, kv_transfer_config=None
    )
    path = tmp_path / "0.json"
    path.write_text(json.dumps(spec.to_json()))
    env = {**os.environ, "VLLM_PLUGINS": "lora_filesystem_resolver"}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_offload.box.engine", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "this engine sleeps" in done.stderr and "VLLM_PLUGINS" in done.stderr


def test_engines_that_sleep_are_launched_for_the_arena(tmp_path: Path) -> None:
    """Each engine of a set that sleeps gets vLLM's sleep mode and the arena's variable;
    a set whose models all stay on the GPU gets neither (nothing sleeps)."""
    host = declared(make_host(None), gpu_mem_gib=80, ram_gib=256)
    sleeping = prepare_box(parse(two_models(tmp_path, max_resident=1)), host, {}, None)
    for spec in sleeping.specs.values():
        assert "--enable-sleep-mode" in spec.args and spec.env[SLEEP_ARENA_ENV] == "1"
        assert SLEEP_KEEP_COPY_ENV not in spec.env  # the host holds every copy: kept
    released = two_models(tmp_path, max_resident=1, host_copy="release")
    for spec in prepare_box(parse(released), host, {}, None).specs.values():
        assert spec.env[SLEEP_KEEP_COPY_ENV] == "0"  # the arena goes back after each wake
    data = two_models(tmp_path)
    for entry in data["models"]:
        entry["max_model_len"] = 8192
    together = prepare_box(parse(data), host, {}, None)
    assert together.plan.max_resident == 2
    for spec in together.specs.values():
        assert "--enable-sleep-mode" not in spec.args and SLEEP_ARENA_ENV not in spec.env


def test_a_layered_wake_is_vllms_worker_class_where_the_weights_wait_in_the_arena(
    tmp_path: Path,
) -> None:
    """residency.layered_wake: each engine that sleeps at level 1 keeping its copy runs our
    worker (--worker-cls, one token: vLLM reads the class as given); where the copy goes
    back after each wake, or the weights are read again (level 2), vLLM's own."""
    host = declared(make_host(None), gpu_mem_gib=80, ram_gib=256)
    flag = f"--worker-cls={LAYERED_WAKE_WORKER}"
    for residency, layered in [
        ({}, False),
        ({"layered_wake": True}, True),
        ({"layered_wake": True, "host_copy": "release"}, False),
        ({"layered_wake": True, "sleep_level": 2}, False),
    ]:
        data = two_models(tmp_path, max_resident=1, **residency)
        for spec in prepare_box(parse(data), host, {}, None).specs.values():
            assert (flag in spec.args) is layered, residency
            if layered:
                assert spec.owned["worker_cls"] == LAYERED_WAKE_WORKER


def test_the_plugin_makes_the_arena_vllms_sleep_backend_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """What the front door waits for before it sleeps an engine (engines.SLEEP_BACKEND_LINE)
    comes from the registration itself, in each vLLM process the plugin loads in."""
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory

    from vllm_offload.vllm_ext import SLEEP_BACKEND_LINE, plugin, sleep

    registry = SleepModeBackendFactory._registry
    monkeypatch.setitem(registry, "cumem", registry["cumem"])  # restored after the test
    monkeypatch.delenv(SLEEP_ARENA_ENV, raising=False)
    plugin.register()
    assert registry["cumem"]() is not sleep.ArenaBackend
    assert SLEEP_BACKEND_LINE not in capfd.readouterr().err
    monkeypatch.setenv(SLEEP_ARENA_ENV, "1")
    plugin.register()
    assert registry["cumem"]() is sleep.ArenaBackend
    assert SLEEP_BACKEND_LINE in capfd.readouterr().err
