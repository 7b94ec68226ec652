"""The manager's HTTP server as a connection flood meets it: a real `vllm-offload manager`
process, raw sockets."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.manager.conftest import TOKEN, Env
from vllm_offload.bench.server_process import free_port
from vllm_offload.upstream.client import wait_until


def closed_by_peer(conn: socket.socket, within_s: float) -> bool:
    """Whether the manager closes ``conn`` within ``within_s`` (what it sent first is read)."""
    conn.settimeout(within_s)
    try:
        while conn.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:  # closed with our trickled bytes unread
        pass
    return True


@pytest.fixture
def manager_port(env: Env, tmp_path: Path) -> Iterator[int]:
    """A real `vllm-offload manager` on a loopback port."""
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
        wait_until(lambda: answers(port), 60, "the manager")
        yield port
    finally:
        manager.terminate()
        manager.wait(timeout=30)


def answers(port: int, source: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=(source, 0)
        ) as probe:
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            return b"200 OK" in probe.recv(200)
    except OSError:
        return False


def test_connections_that_send_no_request_are_closed(manager_port: int) -> None:
    """Issue #15: half-open connections (nothing sent, or a request head sent slowly)
    stayed open for ever and exhausted the manager's file descriptors."""
    idle = socket.create_connection(("127.0.0.1", manager_port))
    slow = socket.create_connection(("127.0.0.1", manager_port))
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head never ends
    # Closed by the manager (its 10 s head timeout), where uvicorn alone waits for ever.
    assert closed_by_peer(idle, 60) and closed_by_peer(slow, 60)
    idle.close()
    slow.close()
    assert answers(manager_port)  # and the manager still serves


def test_connections_trickling_their_next_request_leave_the_manager_to_others(
    manager_port: int,
) -> None:
    """Issue #55: 256 connections, each served one GET /healthz and then trickling its next
    head a byte every 3 s, made the manager answer 503 to everyone (its head timeout held
    for a connection's first request only, and every byte restarted uvicorn's keep-alive
    timer). Now one address holds at most 64 of them, each is closed 10 s after its
    response, and another client is served meanwhile."""
    held: list[socket.socket] = []
    try:
        for _ in range(260):
            conn = socket.create_connection(
                ("127.0.0.1", manager_port), timeout=5, source_address=("127.0.0.2", 0)
            )
            answer = b""
            with contextlib.suppress(ConnectionResetError):  # refused: 503, closed at once
                conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                while chunk := conn.recv(4096):  # the whole response
                    answer += chunk
                    if answer.endswith(b"}"):
                        break
            if b"200 OK" in answer:
                held.append(conn)
            else:
                conn.close()
        assert len(held) <= 64
        trickled = time.monotonic()
        while time.monotonic() - trickled < 12:  # past the 10 s deadline, a byte each 2 s
            for conn in held:
                with contextlib.suppress(OSError):
                    conn.sendall(b"G")
            assert answers(manager_port)  # another address is served all the while
            time.sleep(2)
        assert all(closed_by_peer(conn, 30) for conn in held)
    finally:
        for conn in held:
            conn.close()
