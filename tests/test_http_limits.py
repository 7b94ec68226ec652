"""http_limits (issue #55): uvicorn with our bounded h11 protocol on a loopback port, raw
sockets from two source addresses (127.0.0.2 plays the attacker). Small limits keep it
quick; the manager's and the front door's own numbers are tested against their real
servers (tests/manager/test_http.py, tests/box/test_front_attacks.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from vllm_offload import http_limits
from vllm_offload.upstream.client import wait_until

LIMITS = http_limits.ConnectionLimits(head_s=1.0, body_s=1.0, max_open=64, max_per_source=4)
ATTACKER = "127.0.0.2"


async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", http=http_limits.protocol(LIMITS)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the server")
    yield server.servers[0].sockets[0].getsockname()[1]
    server.should_exit = True
    thread.join(timeout=30)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def get(conn: socket.socket) -> bytes:
    conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return conn.recv(200)


def closed_within(conn: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``conn`` within ``seconds`` (reading what it sends)."""
    conn.settimeout(seconds)
    try:
        while conn.recv(200):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_the_next_head_has_its_deadline_however_slowly_it_trickles(port: int) -> None:
    """After a first request is served, a connection that trickles its next head a byte
    at a time (uvicorn's keep-alive timer restarts at each byte) is closed at head_s."""
    with connect(port) as conn:
        assert b"200 OK" in get(conn)
        began = time.monotonic()
        conn.settimeout(10)
        for byte in b"GET / HTTP/1.1\r\nHost: x\r\n":
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.3)
        assert closed_within(conn, 30)
        assert time.monotonic() - began < 8  # 1 s of head_s, where the trickle needs ~8 s


def test_a_body_has_its_deadline(port: int) -> None:
    with connect(port) as conn:
        conn.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc")
        assert closed_within(conn, 30)


def test_one_address_holds_at_most_its_share_and_the_others_are_served(port: int) -> None:
    held = [connect(port, ATTACKER) for _ in range(LIMITS.max_per_source)]
    try:
        with connect(port, ATTACKER) as refused:
            answer = refused.recv(300)
            assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
        with connect(port) as other:
            assert b"200 OK" in get(other)
    finally:
        for conn in held:
            conn.close()


def test_the_caps_stay_below_the_open_file_limit() -> None:
    assert http_limits.within_open_files(http_limits.FRONT_DOOR, 256).max_open == 128
    assert http_limits.within_open_files(http_limits.FRONT_DOOR, 256).max_per_source == 32
    assert http_limits.within_open_files(http_limits.FRONT_DOOR, 65536) == http_limits.FRONT_DOOR
    assert http_limits.within_open_files(http_limits.MANAGER, 4096) == http_limits.MANAGER


def test_an_ipv6_client_is_its_64() -> None:
    """One client holds a whole /64: counted per address it would hold a cap each."""

    class Seen:
        def __init__(self, host: str) -> None:
            self.client = (host, 1)

    host = http_limits._host
    assert (
        host(Seen("2001:db8:1:2::5")) == host(Seen("2001:db8:1:2:ffff::9")) == "2001:db8:1:2::/64"
    )
    assert host(Seen("::ffff:10.0.0.1")) == host(Seen("10.0.0.1")) == "10.0.0.1"


HELD, RELEASE = threading.Event(), threading.Event()


def answer(conn: socket.socket) -> bytes:
    """One whole response of ``app`` (its body is b"ok"), or what came before the close."""
    got = b""
    while not got.endswith(b"\r\n\r\nok") and (chunk := conn.recv(200)):
        got += chunk
    return got


def hold() -> None:
    HELD.set()
    RELEASE.wait(30)


async def app_held_after(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    """``app``; then, as CI's box did to the manager (its CPU taken for ~20 s), the loop is
    held up after it polled its sockets, when the deadlines that came due meanwhile run:
    one busy timer carries the loop past the deadlines (keep-alive and head, 1 s), so the
    next pass runs ``hold`` and then those deadlines back to back, without a poll between."""
    await app(scope, receive, send)
    if scope["type"] == "http" and not HELD.is_set():
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, time.sleep, 1.2)
        loop.call_later(0.35, hold)


@contextlib.contextmanager
def held_up_server(**config: Any) -> Iterator[uvicorn.Server]:
    """``app_held_after`` under uvicorn in a thread, keep-alive 1 s (``config``: the rest of
    uvicorn.Config's: the loop, where it listens, its protocol); released and stopped at
    the end."""
    HELD.clear()
    RELEASE.clear()
    server = uvicorn.Server(
        uvicorn.Config(app_held_after, log_level="warning", timeout_keep_alive=1, **config)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server")
        yield server
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(timeout=30)


def port_of(server: uvicorn.Server) -> int:
    port: int = server.servers[0].sockets[0].getsockname()[1]
    return port


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_requests_that_came_while_the_loop_was_held_up_are_served(loop: str) -> None:
    """Requests arrive while the server's loop is held up between a poll of its sockets
    and its timers, past their connections' deadlines: the next request of a kept-alive
    connection (its keep-alive deadline) and the first of a new one (its head deadline).
    Closed then, a request was never read and the kernel answered it with a reset
    (test_wedge_browser in CI; a trace of the manager showed its timers run first)."""
    bounded = http_limits.protocol(LIMITS)  # head_s 1 s
    with (
        held_up_server(host="127.0.0.1", port=0, loop=loop, http=bounded) as server,
        connect(port_of(server)) as kept,
        connect(port_of(server)) as new,
    ):
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in answer(kept)
        assert HELD.wait(30)
        for conn in (kept, new):  # both wait in their sockets, unread
            conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.5)  # delivered (a loaded kernel may deliver loopback bytes later)
        RELEASE.set()
        assert b"200 OK" in answer(kept)
        assert b"200 OK" in answer(new)
