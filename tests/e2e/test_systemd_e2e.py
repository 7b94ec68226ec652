"""The rendered server unit run by a real systemctl implementation
(docker-systemctl-replacement's systemctl3, since no systemd runs here)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import psutil
import pytest

from testkit.server import free_port
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.systemd import install, unit_files
from vllm_offload.systemd.control import Systemd
from vllm_offload.upstream.client import VllmClient, wait_until

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
SYSTEMCTL3 = str(BIN / "systemctl3")


def healthy(port: int) -> bool:
    with VllmClient(f"http://127.0.0.1:{port}") as server:
        return server.healthy()


def describe_processes(pids: list[int]) -> str:
    described = []
    for pid in pids:
        try:
            described.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:80]}")
        except psutil.NoSuchProcess:
            described.append(f"{pid} (gone)")
    return "; ".join(described)


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
        unit_files.validate(
            unit_files.InstallOptions(
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


MAX_TOKENS = 8000


@dataclass(kw_only=True, eq=False)
class StreamLog:
    """What one streamed completion saw; times in seconds since the streams began."""

    accepted: threading.Event = field(default_factory=threading.Event)  # HTTP 200 came
    streaming: threading.Event = field(default_factory=threading.Event)  # a chunk came
    first_at: float | None = None
    last_at: float | None = None
    chunks: int = 0
    tokens: int = 0  # the server's count (continuous usage stats)
    finish_reason: str | None = None
    finished: bool = False  # the stream ended without an error
    error: Exception | None = None

    @property
    def cut(self) -> bool:
        """It ended with the connection error of a server gone mid-response (a read
        timeout would be a hang, not this)."""
        return isinstance(self.error, openai.APIConnectionError) and not isinstance(
            self.error, openai.APITimeoutError
        )

    @property
    def whole(self) -> bool:
        """It ended normally, with every token it asked for."""
        return self.finished and self.finish_reason == "length" and self.tokens == MAX_TOKENS

    def describe(self) -> str:
        error = f"{self.error!r} (cause {self.error.__cause__!r})" if self.error else None
        return (
            f"chunks {self.chunks}, tokens {self.tokens}, first {self.first_at}, "
            f"last {self.last_at}, finish_reason {self.finish_reason}, "
            f"finished {self.finished}, error {error}"
        )


def stream(client: openai.OpenAI, log: StreamLog, began: float) -> None:
    try:
        response = client.completions.create(
            model="demo",
            prompt="hello",
            stream=True,
            max_tokens=MAX_TOKENS,
            extra_body={
                "ignore_eos": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        log.accepted.set()
        for chunk in response:
            log.last_at = round(time.monotonic() - began, 2)
            if log.first_at is None:
                log.first_at = log.last_at
            log.chunks += 1
            log.tokens = chunk.usage.completion_tokens if chunk.usage else log.tokens
            if chunk.choices and chunk.choices[0].finish_reason:
                log.finish_reason = chunk.choices[0].finish_reason
            log.streaming.set()
        log.finished = True
    except Exception as exc:  # recorded for the assertions, whatever it is
        log.error = exc


def assert_serves(pid: int, port: int) -> None:
    """The unit's main process is vLLM's API server, listening on ``port``."""
    server = psutil.Process(pid)
    command = " ".join(server.cmdline())
    listens = any(
        c.status == psutil.CONN_LISTEN and c.laddr.port == port
        for c in server.net_connections(kind="tcp")
    )
    assert "vllm_offload serve" in command and listens, (
        f"the unit's MainPID {pid} ({command}) is not the API server listening on {port}"
    )


def test_kill_9_is_restarted_by_the_unit(installed: tuple[Systemd, int, Path]) -> None:
    """Streams in flight when the API server is SIGKILLed end with an error (no hang, no
    silent finish), its processes exit with it (patch 0003) and the unit restarts it.

    "In flight" is made certain, not timed: vLLM generates whether or not the client reads,
    and a loopback socket buffers megabytes (a whole 8,000-token stream is ~2 MB of SSE),
    so a client's last token says nothing about the server; on a busy box this test's
    process went unscheduled for 30 s while the server finished every stream into those
    buffers, and read them whole after the kill. So two streams start while vLLM generates
    (each may be cut, or may already be whole: either is right) and two are accepted while
    its engine is stopped (SIGSTOP), so they cannot end before the kill but by an error.
    """
    systemd, port, root = installed
    # systemctl3 supervises (Restart=) only as an init process.
    init = subprocess.Popen(
        [SYSTEMCTL3, f"--root={root}", "--init", "start", "vllm.service"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    logs = [StreamLog() for _ in range(4)]
    under_way, waiting = logs[:2], logs[2:]
    evidence: list[str] = []
    children: list[int] = []  # the API server's processes: stopped, then killed with it
    try:
        wait_until(lambda: healthy(port), 300, "the server to answer")
        first = systemd.status("vllm").main_pid
        assert first is not None
        old = tree(first)  # the API server, its EngineCore and worker, multiprocessing's helper
        evidence.append(f"MainPID {first}; its processes {describe_processes(old)}")
        assert_serves(first, port)
        assert len(old) >= 3, old
        # No read timeout cuts a stream: only the server's death may end the waiting ones.
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=600, max_retries=0
        )
        model = client.models.list().data[0]
        evidence.append(f"max_model_len {(model.model_extra or {}).get('max_model_len')}")
        began = time.monotonic()
        threads = [
            threading.Thread(target=stream, args=(client, log, began), daemon=True) for log in logs
        ]
        for t, log in zip(threads[:2], under_way, strict=True):
            t.start()
            assert log.streaming.wait(300), f"a stream never started: {log.describe()}"
        children = old[1:]
        for pid in children:  # vLLM's engine generates nothing more
            os.kill(pid, signal.SIGSTOP)
        for t, log in zip(threads[2:], waiting, strict=True):
            t.start()
            assert log.accepted.wait(300), f"a stream was never accepted: {log.describe()}"
        evidence.append(f"SIGKILL {first} at {time.monotonic() - began:.2f} s")
        os.kill(first, signal.SIGKILL)
        for pid in children:
            os.kill(pid, signal.SIGCONT)
        for t in threads:
            t.join(timeout=300)
        for i, (t, log) in enumerate(zip(threads, logs, strict=True)):
            assert not t.is_alive(), f"stream {i} hangs after the kill: {log.describe()}"
            if log in waiting:
                assert log.cut, (
                    f"stream {i}, accepted while the engine was stopped, did not end with a "
                    f"connection error (was the API server killed?): {log.describe()}"
                )
            else:
                assert log.cut or log.whole, (
                    f"stream {i} ended without an error and without all its {MAX_TOKENS} "
                    f"tokens: {log.describe()}"
                )
        # None of them outlives the API server (patch 0003): an orphaned engine would hold
        # the GPU and the restarted server could not start.
        wait_until(
            lambda: not any(psutil.pid_exists(p) for p in children),
            120,
            f"the killed server's processes {children} to exit",
        )
        wait_until(
            lambda: systemd.status("vllm").main_pid not in (None, first), 120, "a new main PID"
        )
        wait_until(lambda: healthy(port), 300, "the restarted server to answer")
        assert systemd.status("vllm").main_pid != first
    except BaseException:
        # What the streams saw and what the server logged, so that a failure explains itself.
        print("\n".join(evidence))
        for i, log in enumerate(logs):
            print(f"stream {i}: {log.describe()}")
        print("\n".join(systemd.logs("vllm", 120)))
        raise
    finally:
        for pid in children:  # never left stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        subprocess.run([SYSTEMCTL3, f"--root={root}", "stop", "vllm.service"], timeout=120)
        os.killpg(init.pid, signal.SIGTERM)
        init.wait(timeout=60)
