"""How a failed arm is described: its server's exit is waited for, not raced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from vllm_offload.bench import harness
from vllm_offload.bench.harness import failure
from vllm_offload.bench.server_process import ServerProcess


def test_a_server_that_exits_just_after_the_error_is_named(tmp_path: Path) -> None:
    """A killed server's connection resets before the process has exited (the bench e2e
    test once saw "Connection reset by peer" with no exit code): the failure waits for it."""
    server = ServerProcess(serve_args=[], log_path=tmp_path / "arm.log")
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1); exit(3)"])
    said = failure(server, 1, httpx.ReadError("[Errno 104] Connection reset by peer"))
    assert said.startswith("repeat 1: ReadError: ") and "its server exited with code 3" in said


def test_a_server_still_serving_is_not_said_to_have_exited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "EXIT_AFTER_ERROR_S", 1.0)
    server = ServerProcess(serve_args=[], log_path=tmp_path / "arm.log")
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        said = failure(server, 2, httpx.ReadTimeout("timed out"))
    finally:
        server.proc.kill()
        server.proc.wait()
    assert "exited" not in said and said.startswith("repeat 2: ReadTimeout: timed out")
