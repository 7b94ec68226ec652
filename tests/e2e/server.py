"""A real vLLM server process for end-to-end tests, started through vllm-offload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from vllm_offload.bench.runner import free_port

VLLM_OFFLOAD = str(Path(sys.executable).parent / "vllm-offload")
START_TIMEOUT_S = 300


def server_env(scratch: Path) -> dict[str, str]:
    """Caches under a temp dir; VLLM_CPU_KVCACHE_SPACE unset so the plan sizes the pool."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(
        VLLM_CACHE_ROOT=str(scratch / "vllm-cache"),
        XDG_CACHE_HOME=str(scratch / "xdg-cache"),
        HF_HOME=str(scratch / "hf"),
        HF_HUB_OFFLINE="1",
        TORCHINDUCTOR_CACHE_DIR=str(scratch / "inductor"),
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
    )
    return env


class Server:
    """`vllm-offload serve ...` in its own session; stop() checks nothing is left behind."""

    def __init__(
        self,
        args: list[str],
        scratch: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.env = {**server_env(scratch), **(env or {})}
        self.log_path = scratch / f"server-{self.port}.log"
        self.argv = [VLLM_OFFLOAD, "serve", "--port", str(self.port), *args]
        self.scratch = scratch
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start and wait for /health; returns seconds to healthy."""
        began = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
            )  # fmt: skip
        while time.monotonic() - began < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - began
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"server not healthy in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def session_processes(self) -> list[psutil.Process]:
        assert self.proc is not None
        sid = self.proc.pid  # start_new_session: the session id is the leader's pid
        found = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == sid:
                    found.append(p)
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        return found

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM the server (as systemd and Ctrl-C do) and wait; return its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        deadline = time.monotonic() + 15
        while self.session_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        return code
