"""The rendered server unit run by a real systemctl implementation
(docker-systemctl-replacement's systemctl3, since no systemd runs here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest

from tests.e2e.server import free_port
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.systemd import install
from vllm_offload.systemd.control import Systemd
from vllm_offload.vllm_client import VllmClient, wait_until

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
SYSTEMCTL3 = str(BIN / "systemctl3")


def healthy(port: int) -> bool:
    with VllmClient(f"http://127.0.0.1:{port}") as server:
        return server.healthy()


def tree(pid: int) -> list[int]:
    try:
        parent = psutil.Process(pid)
        return [pid, *(c.pid for c in parent.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


@pytest.fixture
def installed(tmp_path: Path, demo_dir: Path) -> Iterator[tuple[Systemd, int, Path]]:
    root = tmp_path / "a" / "b" / "root"
    port = free_port()
    config = tmp_path / "config.toml"
    save(
        with_overrides(
            DeploymentConfig(),
            {
                "model.path": str(demo_dir),
                "model.served_name": "demo",
                "server.port": port,
                "gpu.kv_cache_memory_bytes": 64 << 20,
                "extra_args": ["--enforce-eager"],
            },
        ),
        config,
    )
    state = tmp_path / "state"
    state.mkdir()  # where the unit's WorkingDirectory points on this host
    install.install(
        install.validate(
            install.InstallOptions(
                root=root,
                user="root",
                config=config,
                config_given=True,
                state_dir=state,
            )
        )
    )
    systemd = Systemd(systemctl=(SYSTEMCTL3,), journalctl=(str(BIN / "journalctl3"),), root=root)
    yield systemd, port, root
    subprocess.run([SYSTEMCTL3, f"--root={root}", "stop", "vllm.service"], timeout=120)


def test_start_status_restart_stop(installed: tuple[Systemd, int, Path]) -> None:
    systemd, port, _root = installed
    systemd.start("vllm")
    wait_until(lambda: healthy(port), 300, "the server to answer")
    status = systemd.status("vllm")
    assert status.active_state == "active" and status.main_pid is not None
    first = status.main_pid
    assert psutil.Process(first).is_running()
    assert "vllm_offload serve" in " ".join(psutil.Process(first).cmdline())
    assert any("Application startup complete" in line for line in systemd.logs("vllm", 400))

    systemd.restart("vllm")
    wait_until(lambda: healthy(port), 300, "the restarted server to answer")
    second = systemd.status("vllm").main_pid
    assert second is not None and second != first

    processes = tree(second)
    systemd.stop("vllm")
    wait_until(lambda: not healthy(port), 60, "the port to close")
    wait_until(lambda: not any(psutil.pid_exists(p) for p in processes), 60, "no process left")
    assert systemd.status("vllm").active_state != "active"


def test_kill_9_is_restarted_by_the_unit(installed: tuple[Systemd, int, Path]) -> None:
    systemd, port, root = installed
    # systemctl3 supervises (Restart=) only as an init process.
    init = subprocess.Popen(
        [SYSTEMCTL3, f"--root={root}", "--init", "start", "vllm.service"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: healthy(port), 300, "the server to answer")
        first = systemd.status("vllm").main_pid
        assert first is not None
        # Requests in flight when the server dies get an error, not a hang.
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=30, max_retries=0
        )
        outcomes: list[str] = []
        streaming = [threading.Event() for _ in range(4)]

        def stream(started: threading.Event) -> None:
            try:
                for _ in client.completions.create(
                    model="demo",
                    prompt="hello",
                    stream=True,
                    max_tokens=8000,
                    extra_body={"ignore_eos": True},
                ):
                    started.set()
                outcomes.append("finished")
            except openai.APIError as exc:
                outcomes.append(type(exc).__name__)

        threads = [threading.Thread(target=stream, args=(e,)) for e in streaming]
        for t in threads:
            t.start()
        # Killed while the streams are under way: once the first token of one arrived, the
        # others get a second to start (a request still waiting for its first token is in
        # flight too). Waiting for all four first failed once on CI's busy box with all
        # four finished; a fixed pause before that let fast streams finish first.
        wait_until(lambda: any(e.is_set() for e in streaming), 120, "a stream to start")
        for started in streaming:
            started.wait(1)
        old = tree(first)  # the API server, its EngineCore and worker, multiprocessing's helper
        assert len(old) >= 3, old
        os.kill(first, signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
        assert len(outcomes) == 4 and "finished" not in outcomes, outcomes
        # None of them outlives the API server (patch 0003): an orphaned engine would hold
        # the GPU and the restarted server could not start.
        wait_until(
            lambda: not any(psutil.pid_exists(p) for p in old[1:]),
            60,
            f"the killed server's processes {old[1:]} to exit",
        )
        wait_until(
            lambda: systemd.status("vllm").main_pid not in (None, first), 60, "a new main PID"
        )
        wait_until(lambda: healthy(port), 300, "the restarted server to answer")
        assert systemd.status("vllm").main_pid != first
    finally:
        subprocess.run([SYSTEMCTL3, f"--root={root}", "stop", "vllm.service"], timeout=120)
        os.killpg(init.pid, signal.SIGTERM)
        init.wait(timeout=60)
