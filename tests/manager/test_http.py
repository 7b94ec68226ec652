"""The manager's HTTP server as a connection flood meets it: a real `vllm-offload manager`
process, raw sockets."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.manager.conftest import TOKEN, Env
from vllm_offload.bench.server_process import free_port
from vllm_offload.vllm_client import wait_until


def closed_by_peer(conn: socket.socket, within_s: float) -> bool:
    conn.settimeout(within_s)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False


def test_connections_that_send_no_request_are_closed(env: Env, tmp_path: Path) -> None:
    """Issue #15: half-open connections (nothing sent, or a request head sent slowly)
    stayed open for ever and exhausted the manager's file descriptors."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    port = free_port()
    manager = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_offload",
            "manager",
            "--port",
            str(port),
            "--token-file",
            str(token),
            "--config",
            str(env.config_path),
            "--systemd-root",
            str(env.root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def answers() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    return b"200 OK" in probe.recv(200)
            except OSError:
                return False

        wait_until(answers, 60, "the manager")
        idle = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        # Closed by the manager (its 10 s head timeout), where uvicorn alone waits for ever.
        assert closed_by_peer(idle, 60) and closed_by_peer(slow, 60)
        idle.close()
        slow.close()
        assert answers()  # and the manager still serves
    finally:
        manager.terminate()
        manager.wait(timeout=30)
