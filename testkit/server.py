"""A real vLLM server process for end-to-end tests, started through vllm-offload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from vllm_offload.bench.server_process import ServerProcess, free_port

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
    """`vllm-offload serve ...` (the console script) in its own session, through the bench
    server process; stop() also waits until no process of its session is left."""

    def __init__(
        self,
        args: list[str],
        scratch: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.env = {**server_env(scratch), **(env or {})}
        port = port or free_port()
        served_name, args = _take_served_name(args)
        self.process = ServerProcess(
            serve_args=args,
            log_path=scratch / f"server-{port}.log",
            port=port,
            served_name=served_name,
            env=self.env,
            command=[VLLM_OFFLOAD],
        )

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def base_url(self) -> str:
        return self.process.base_url

    def start(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Start and wait for /health; returns seconds to healthy."""
        self.process.start()
        try:
            return self.process.wait_healthy(timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            self.stop()
            raise RuntimeError(f"{exc}:\n{self.log()}") from None

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

    def stop(self, timeout_s: float = 60) -> int | None:
        """SIGTERM to the main process only (as systemd's KillMode=mixed does): vLLM must
        take its own children down. Then wait for the whole session to be gone."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise
        code = self.proc.returncode
        deadline = time.monotonic() + 15
        while self.proc is not None and self.session_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        return code


def _take_served_name(args: list[str]) -> tuple[str, list[str]]:
    """The --model-served-name value (ServerProcess passes it) and the other args."""
    flag = "--model-served-name"
    if flag not in args:
        return "m", args
    i = args.index(flag)
    return args[i + 1], args[:i] + args[i + 2 :]
