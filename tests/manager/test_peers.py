"""More than one box (issue #44): the manager shows [cluster]'s boxes and whether each
answers now — one real HTTP server standing in for a box that is up, a closed port for
one that is down."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.manager.conftest import BEARER, Env
from vllm_offload import config as config_mod
from vllm_offload.bench.server_process import free_port


class Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def box() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.mark.anyio
async def test_the_page_lists_each_box_and_whether_it_answers(
    client: httpx.AsyncClient, env: Env, box: str
) -> None:
    assert (await client.get("/api/peers", headers=BEARER)).json() == {"peers": []}
    saved = config_mod.load(env.config_path)
    boxes = [
        {"name": "gpu1", "url": box, "models": ["chat"]},
        {"name": "gpu2", "url": f"http://127.0.0.1:{free_port()}", "models": ["coder"]},
    ]
    config_mod.save(config_mod.with_overrides(saved, {"cluster.boxes": boxes}), env.config_path)
    peers = (await client.get("/api/peers", headers=BEARER)).json()["peers"]
    assert [(p["name"], p["models"], p["state"]) for p in peers] == [
        ("gpu1", ["chat"], "up"),
        ("gpu2", ["coder"], "down"),
    ]
    assert (await client.get("/api/peers")).status_code == 401  # the token, as everywhere
