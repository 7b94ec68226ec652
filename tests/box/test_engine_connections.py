"""Our clients of vLLM's server (issue #54's trust round: CI's resets). vLLM's server is
uvicorn: it closes an idle connection at its keep-alive deadline without asking whether a
request came, so a loop held up between its poll and its timers (a box whose CPU is taken)
resets a request sent on a kept connection. The front door (on an engine's unix socket)
and VllmClient (the manager's probes, on its port) open a connection per request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from pathlib import Path

import pytest
import uvicorn

from tests.test_http_limits import HELD, RELEASE, app_held_after
from vllm_offload.box.engines import uds_client
from vllm_offload.upstream.client import VllmClient, wait_until


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_sent_while_the_engine_is_held_up_is_answered(tmp_path: Path, loop: str) -> None:
    HELD.clear()
    RELEASE.clear()
    socket_path = tmp_path / "engine.sock"
    config = uvicorn.Config(  # as vLLM runs it, keep-alive shortened from its 5 s
        app_held_after, uds=str(socket_path), log_level="warning", loop=loop, timeout_keep_alive=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    async def two_requests() -> None:
        async with uds_client(socket_path, 30.0) as engine:
            assert (await engine.get("/")).status_code == 200
            assert await asyncio.to_thread(HELD.wait, 30)
            second = asyncio.create_task(engine.get("/"))
            await asyncio.sleep(0.5)  # sent, and waiting in the socket
            RELEASE.set()
            assert (await second).status_code == 200

    try:
        wait_until(lambda: server.started, 30, "the engine")
        asyncio.run(two_requests())
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(timeout=30)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_probe_sent_while_the_server_is_held_up_is_answered(loop: str) -> None:
    HELD.clear()
    RELEASE.clear()
    config = uvicorn.Config(
        app_held_after,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        loop=loop,
        timeout_keep_alive=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the server")
        port = server.servers[0].sockets[0].getsockname()[1]
        with VllmClient(f"http://127.0.0.1:{port}", timeout_s=30) as probe:
            assert probe.healthy()
            assert HELD.wait(30)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                second = pool.submit(probe.healthy)
                time.sleep(0.5)  # sent, and waiting in the socket
                RELEASE.set()
                assert second.result(timeout=60)
    finally:
        RELEASE.set()
        server.should_exit = True
        thread.join(timeout=30)
