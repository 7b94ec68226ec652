"""Several models, stopped at the worst moment (issue #43): SIGTERM while the default
model's real vLLM CPU engine is still starting (its weights loaded, its server not up yet)
must end the front door, the engine and every process under it within the runner's stated
bound (box.runner.STOP_BOUND_S). Before the fix it did not: vLLM went on starting and
served, and 60 s later every process was still there (the front door gave an engine 120 s
after SIGTERM)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from testkit.server import VLLM_OFFLOAD, server_env
from tests.e2e.test_fleet_e2e import two_models
from vllm_offload.bench.server_process import free_port
from vllm_offload.box.control import read_models
from vllm_offload.box.runner import STOP_BOUND_S
from vllm_offload.config import save
from vllm_offload.upstream.client import wait_until

pytestmark = pytest.mark.e2e
# The stated bound, and room for a busy 2-core box to reap what was killed.
MARGIN_S = 30
LOADED = "Loading weights took"  # vLLM's line, some seconds before its server is up


def tree(pid: int) -> set[psutil.Process]:
    """The process and its descendants (psutil's records: a reused pid is not them)."""
    try:
        proc = psutil.Process(pid)
        return {proc, *proc.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def alive(procs: set[psutil.Process]) -> set[int]:
    """Those still running (a zombie has ended: only its parent's wait is missing)."""
    left = set()
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.add(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return left


def test_sigterm_while_an_engine_starts_stops_everything(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    save(two_models(tmp_path, free_port()), config)
    log = tmp_path / "front.log"
    with log.open("wb") as out:
        front = subprocess.Popen(
            [VLLM_OFFLOAD, "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=server_env(tmp_path),
            start_new_session=True,
        )
    control = tmp_path / "run" / "control.sock"
    seen: set[psutil.Process] = set()

    def loading() -> bool:
        """The default model's engine has loaded its weights and is still starting."""
        assert front.poll() is None, log.read_text(errors="replace")[-4000:]
        seen.update(tree(front.pid))
        return LOADED in log.read_text(errors="replace")

    try:
        wait_until(loading, 600, "the engine of 'chat' to load its weights")
        assert (read_models(control) or {})["models"]["chat"]["state"] == "starting"
        front.send_signal(signal.SIGTERM)
        began = time.monotonic()
        deadline = began + STOP_BOUND_S + MARGIN_S
        while alive(seen | tree(front.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = alive(seen | tree(front.pid))
        assert not left, (
            f"still running {time.monotonic() - began:.0f} s after SIGTERM: "
            f"{sorted(left)}\n{log.read_text(errors='replace')[-4000:]}"
        )
        assert front.wait(timeout=10) == 0
        print(f"everything ended {time.monotonic() - began:.1f} s after SIGTERM")
    finally:
        for proc in seen | tree(front.pid):
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.is_running():
                    proc.kill()
