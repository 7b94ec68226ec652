"""Issue #38 item 5: the manager next to a server started by hand (`make serve`, a
`vllm-offload serve` in a terminal) with the unit down. The page showed `stopped`, the
config's model, an empty log and its own server under "Other vLLM servers"; now it shows
the server's own account and says what the manager cannot do for it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import stack
from testkit.server import VLLM_OFFLOAD, Server, server_env
from tests.e2e.test_fleet_e2e import START_S, two_models
from vllm_offload.bench.server_process import free_port
from vllm_offload.config import save, with_overrides
from vllm_offload.systemd import install, unit_files
from vllm_offload.systemd.control import Systemd
from vllm_offload.upstream.client import VllmClient, wait_until

pytestmark = pytest.mark.e2e
TOKEN = "hand-run-token-0123456789"


@pytest.fixture
def deployment(tmp_path: Path, demo_dir: Path) -> Iterator[stack.Deployment]:
    """The units installed (not started) and the same config served by hand."""
    deployment = stack.install(tmp_path, demo_dir)
    (tmp_path / "hand").mkdir()
    server = Server(
        ["--config", str(deployment.config), "--model-served-name", "by-hand"],
        tmp_path / "hand",
        port=deployment.server_port,
    )
    server.start()
    try:
        yield deployment
    finally:
        server.stop()


def by_hand(manager: httpx.Client) -> dict[str, Any]:
    """/api/status once the manager's sampler has seen the server answer (its first probe
    runs beside the manager's start: on a busy box the first status can predate it)."""
    seen: list[dict[str, Any]] = []

    def answered() -> bool:
        seen.append(manager.get("/api/status").json())
        return seen[-1]["health"] == "by-hand"

    wait_until(answered, 60, "the manager to see the server started by hand")
    return seen[-1]


def test_the_manager_shows_a_server_started_by_hand(
    tmp_path: Path, deployment: stack.Deployment
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        stack.manager(tmp_path, deployment, TOKEN) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as manager,
    ):
        status = by_hand(manager)
        assert status["served_name"] == "by-hand"  # the server's own, not the config's
        assert status["hand_run"]["models"] == ["by-hand"]
        assert status["pid"] is not None and status["uptime_s"] is not None
        assert "started by hand" in status["reason"] and "vllm.service" in status["reason"]
        assert (
            manager.get("/api/logs")
            .json()["lines"][0]
            .startswith("(the server answering now was started by hand")
        )
        ports = [s["port"] for s in manager.get("/api/detect").json()["servers"]]
        assert deployment.server_port not in ports  # not an "other" server


def test_bring_in_reaches_a_fleet_started_by_hand(tmp_path: Path) -> None:
    """Two models served by hand: the cards show each model's state from the front door
    itself, and "Bring in" reaches its control socket (it went to the unit's, in /run)."""
    port = free_port()
    config = tmp_path / "etc" / "config.toml"
    config.parent.mkdir()
    # No residency.runtime_dir: each finds the socket on its own, from its environment.
    save(with_overrides(two_models(tmp_path, port), {"residency.runtime_dir": ""}), config)
    runtime = Path(tempfile.mkdtemp(prefix="vo-xdg-", dir="/tmp"))  # socket paths are short
    env = {"XDG_RUNTIME_DIR": str(runtime)}
    root = tmp_path / "a" / "b" / "root"
    install.install(
        unit_files.validate(
            unit_files.InstallOptions(
                root=root,
                user="root",
                config=config,
                config_given=True,
                state_dir=tmp_path / "state",
            )
        )
    )
    systemd = Systemd(
        systemctl=(stack.SYSTEMCTL3,), journalctl=(str(stack.BIN / "journalctl3"),), root=root
    )
    deployment = stack.Deployment(config=config, root=root, server_port=port, systemd=systemd)
    log = tmp_path / "front.log"
    with log.open("wb") as out:
        front = subprocess.Popen(
            [VLLM_OFFLOAD, "serve", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**server_env(tmp_path), **env},
            start_new_session=True,
        )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with VllmClient(f"http://127.0.0.1:{port}") as server:
            server.wait_healthy(START_S, alive=lambda: front.poll() is None)
        with (
            stack.manager(tmp_path, deployment, TOKEN, env) as url,
            httpx.Client(base_url=url, headers=headers, timeout=START_S) as manager,
        ):
            status = by_hand(manager)
            states = {card["name"]: card["state"] for card in status["models"]}
            assert states == {"chat": "serving", "coder": "stopped"}, states
            moved = manager.post("/api/models/coder/bring-in")
            assert moved.status_code == 200, moved.text
            cards = manager.get("/api/status").json()["models"]
            assert {c["name"]: c["state"] for c in cards}["coder"] == "serving"
    finally:
        front.send_signal(signal.SIGTERM)
        front.wait(timeout=180)
        shutil.rmtree(runtime, ignore_errors=True)
