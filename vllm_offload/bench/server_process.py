"""A server under test: `vllm-offload serve` in its own session, measured and stopped."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from vllm_offload.upstream.client import VllmClient

GIB = 1 << 30
LOG_PATTERNS = {
    "kv_cache_tokens": r"KV cache size: ([\d,]+) tokens",
    "arena_gib": r"registered host arena: ([\d.]+)",  # GiB
    "offloaded_gib": r"Total CPU offloaded parameters: ([\d.]+)",  # GiB
    "prefetch_offloaded_gb": r"\[PrefetchOffloader\] .* Total GPU memory saved: ([\d.]+) GB",
}
# `python -m`, so it also runs where the package is on PYTHONPATH but not installed.
VLLM_OFFLOAD = [sys.executable, "-m", "vllm_offload"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scan_log(text: str) -> dict[str, float | None]:
    """What vLLM (patched or not) logged about the KV pool, the CPU tier and offload."""
    found: dict[str, float | None] = {}
    for key, pattern in LOG_PATTERNS.items():
        match = re.search(pattern, text)
        found[key] = float(match.group(1).replace(",", "")) if match else None
    registered = re.findall(r"Registered the CPU KV tier: .* in ([\d.]+) s", text)
    found["tier_registered_s"] = round(sum(map(float, registered)), 2) if registered else None
    # Unpatched vLLM 0.25 logs each pinned tier tensor at DEBUG level.
    pinned = re.findall(r"torch\.zeros pinned tensor .*: ([\d.]+) s", text)
    found["tier_pinned_s"] = round(sum(map(float, pinned)), 3) if pinned else None
    return found


@dataclass(kw_only=True)
class ServerProcess:
    serve_args: list[str]  # vllm-offload serve flags, then "--", then vLLM's own
    log_path: Path
    port: int = field(default_factory=free_port)
    served_name: str | None = "m"  # None: the config names the models ([[models]])
    env: dict[str, str] | None = None  # None: this process's environment
    command: list[str] = field(default_factory=lambda: list(VLLM_OFFLOAD))
    proc: subprocess.Popen[bytes] | None = None
    healthy_s: float | None = None
    started_at: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        ours, sep, theirs = split_serve_args(self.serve_args)
        argv = [
            *self.command,
            "serve",
            *ours,
            "--port",
            str(self.port),
            *(["--model-served-name", self.served_name] if self.served_name else []),
            *sep,
            *theirs,
        ]
        self.started_at = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def wait_healthy(self, timeout_s: float = 600) -> float:
        """Seconds from the start until /health answers; raises RuntimeError if the
        server exits first, TimeoutError after ``timeout_s``."""
        proc = self.proc
        assert proc is not None
        with VllmClient(self.base_url) as server:
            try:
                server.wait_healthy(timeout_s, alive=lambda: proc.poll() is None, poll_s=0.25)
            except RuntimeError:
                raise RuntimeError(
                    f"server exited {proc.returncode}; see {self.log_path}"
                ) from None
            except TimeoutError as exc:
                raise TimeoutError(f"{exc}; see {self.log_path}") from None
        self.healthy_s = time.monotonic() - self.started_at
        return self.healthy_s

    def host_ram_bytes(self) -> int:
        """Resident memory of the server's whole process tree (pinned pages included)."""
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def log_facts(self) -> dict[str, float | None]:
        return scan_log(self.log_path.read_text(errors="replace"))

    def stop(self, timeout_s: float = 90) -> int | None:
        """SIGTERM the server (as systemd and Ctrl-C do), wait; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def split_serve_args(args: list[str]) -> tuple[list[str], list[str], list[str]]:
    if "--" in args:
        cut = args.index("--")
        return args[:cut], ["--"], args[cut + 1 :]
    return args, [], []
