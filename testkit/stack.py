"""The deployment the browser tests drive: a config serving demo models, the rendered
units under a systemctl3 root (docker-systemctl-replacement, since no systemd runs here)
and the manager process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from testkit.server import server_env
from vllm_offload.bench.server_process import free_port
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.systemd import install as units
from vllm_offload.systemd import unit_files
from vllm_offload.systemd.control import Systemd
from vllm_offload.upstream.client import VllmClient, wait_until

BIN = Path(sys.executable).parent
SYSTEMCTL3 = str(BIN / "systemctl3")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def wait_server(port: int, timeout_s: float = 300) -> None:
    """Until the vLLM server on ``port`` answers /health."""
    with VllmClient(f"http://127.0.0.1:{port}") as server:
        server.wait_healthy(timeout_s)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True, kw_only=True)
class Deployment:
    config: Path
    root: Path  # systemctl3's --root
    server_port: int
    systemd: Systemd


def install(tmp_path: Path, model: Path) -> Deployment:
    """A config serving ``model`` (its directory is the model root) and the units
    rendered from it, as `vllm-offload install-service --root` writes them."""
    port = free_port()
    config = tmp_path / "etc" / "config.toml"
    save(
        with_overrides(
            DeploymentConfig(),
            {
                "model.path": str(model),
                "server.port": port,
                "gpu.kv_cache_memory_bytes": 64 << 20,
                "extra_args": ["--enforce-eager"],
                "manager.model_roots": [str(model.parent)],
            },
        ),
        config,
    )
    state = tmp_path / "state"
    state.mkdir()
    root = tmp_path / "a" / "b" / "root"
    units.install(
        unit_files.validate(
            unit_files.InstallOptions(
                root=root, user="root", config=config, config_given=True, state_dir=state
            )
        )
    )
    return Deployment(
        config=config,
        root=root,
        server_port=port,
        systemd=Systemd(systemctl=(SYSTEMCTL3,), journalctl=(str(BIN / "journalctl3"),), root=root),
    )


@contextmanager
def manager(
    tmp_path: Path, deployment: Deployment, token: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """The manager controlling the deployment's unit (``env`` over the servers'); its URL
    once it answers."""
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port = free_port()
    # Kept beside the test's files (pytest keeps the last runs' folders): CI once read a
    # reset from the manager mid-test (test_wedge_browser) with nothing to say whether the
    # manager had died or only closed the connection.
    log = (tmp_path / "manager.log").open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_offload",
            "manager",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--config",
            str(deployment.config),
            "--systemd-root",
            str(deployment.root),
        ],
        env={**server_env(tmp_path), **(env or {})},
        stdout=log,
        stderr=log,
    )
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthz"), 60, "the manager")
        yield f"http://127.0.0.1:{port}"
    finally:
        ended = process.poll()  # None: it was still running when the test ended
        state = "still running" if ended is None else f"ended with {ended}"
        log.write(f"[testkit] at teardown the manager was {state}\n".encode())
        log.flush()
        process.terminate()
        process.wait(timeout=30)
        log.close()
