"""The front door's connections to an engine (issue #54's trust round: CI's resets). vLLM's
server is uvicorn: it closes an idle connection at its keep-alive deadline without asking
whether a request came, so a loop held up between its poll and its timers (a box whose
CPU is taken) resets a request sent on a kept connection. The front door opens a
connection per request (a unix socket's connect costs microseconds)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import uvicorn

from tests.test_http_limits import HELD, RELEASE, app_held_after
from vllm_offload.box.engines import uds_client
from vllm_offload.upstream.client import wait_until


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
