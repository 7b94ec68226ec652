"""Our clients of vLLM's server (issue #54's trust round: CI's resets). vLLM's server is
uvicorn: it closes an idle connection at its keep-alive deadline without asking whether a
request came, so a loop held up between its poll and its timers (a box whose CPU is taken)
resets a request sent on a kept connection. The front door (on an engine's unix socket)
and VllmClient (the manager's probes, on its port) open a connection per request."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

import pytest

from tests.test_http_limits import HELD, RELEASE, held_up_server, port_of
from vllm_offload.box.engines import uds_client
from vllm_offload.upstream.client import VllmClient


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_sent_while_the_engine_is_held_up_is_answered(tmp_path: Path, loop: str) -> None:
    socket_path = tmp_path / "engine.sock"

    async def two_requests() -> None:
        async with uds_client(socket_path, 30.0) as engine:
            assert (await engine.get("/")).status_code == 200
            assert await asyncio.to_thread(HELD.wait, 30)
            second = asyncio.create_task(engine.get("/"))
            await asyncio.sleep(0.5)  # sent, and waiting in the socket
            RELEASE.set()
            assert (await second).status_code == 200

    # uvicorn as vLLM runs it (its own protocol), keep-alive shortened from vLLM's 5 s
    with held_up_server(uds=str(socket_path), loop=loop):
        asyncio.run(two_requests())


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_probe_sent_while_the_server_is_held_up_is_answered(loop: str) -> None:
    with (
        held_up_server(host="127.0.0.1", port=0, loop=loop) as server,
        VllmClient(f"http://127.0.0.1:{port_of(server)}", timeout_s=30) as probe,
    ):
        assert probe.healthy()
        assert HELD.wait(30)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            second = pool.submit(probe.healthy)
            time.sleep(0.5)  # sent, and waiting in the socket
            RELEASE.set()
            assert second.result(timeout=60)
