"""The switch progress the page shows (issue #43), read from the front door's /models row:
the step under way, for how long, the requests waiting, the last steps' lengths. Whoever
runs as the server's user can answer on the control socket, so each value is taken only
if it is of its kind."""

from __future__ import annotations

import contextlib
import json
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.manager.conftest import BEARER, Env
from vllm_offload import config as config_mod
from vllm_offload.box.prepare import CONTROL_SOCKET
from vllm_offload.manager.switches import ended, progress, switches


def test_a_front_door_s_row_becomes_the_card_s_progress() -> None:
    row = {
        "status": "away",
        "waiting": 2,
        "step": "bring-in",
        "step_elapsed_s": 3.4,
        "bring_in_s": 12,
        "put_away_s": None,
        "expected_wait_s": 0.0,
    }
    assert progress(row) == {
        "step": "bring-in",
        "elapsed_s": 3.4,
        "waiting": 2,
        "last_bring_in_s": 12.0,
        "last_put_away_s": None,
        "expected_wait_s": 0.0,
    }


def test_values_not_of_their_kind_are_unknown() -> None:
    hostile = json.loads(
        '{"step": "<script>", "step_elapsed_s": Infinity, "waiting": true,'
        ' "bring_in_s": -1, "put_away_s": "5", "expected_wait_s": 1e400}'
    )
    assert progress(hostile) == {
        "step": None,
        "elapsed_s": None,
        "waiting": 0,
        "last_bring_in_s": None,
        "last_put_away_s": None,
        "expected_wait_s": None,
    }
    assert progress({"waiting": 10**400, "bring_in_s": 10**400})["waiting"] == 0
    assert progress({"bring_in_s": 10**400})["last_bring_in_s"] is None
    assert progress(None) == progress({}) == progress(["step"])


def test_the_steps_that_ended_become_the_strip_s_bars() -> None:
    events = [
        {"t": 110.5, "model": "coder", "step": "bring-in", "seconds": 20, "text": "started"},
        {"t": 90.0, "model": "chat", "step": "put-away", "seconds": 1.5, "text": "stopped"},
        {"t": 95.0, "model": "chat", "step": None, "seconds": None, "text": "failed"},
    ]
    assert ended(switches(events), {"chat", "coder"}) == [
        {"model": "chat", "step": "put-away", "t": 90.0, "seconds": 1.5},
        {"model": "coder", "step": "bring-in", "t": 110.5, "seconds": 20.0},
    ]


def test_steps_not_of_their_kind_are_left_out() -> None:
    good = {"t": 1.0, "model": "chat", "step": "bring-in", "seconds": 2.0}
    hostile = json.loads(
        '[{"t": Infinity, "model": "chat", "step": "bring-in", "seconds": 1},'
        ' {"t": 1, "model": "<img>", "step": "bring-in", "seconds": 1},'
        ' {"t": 1, "model": "chat", "step": "<script>", "seconds": 1},'
        ' {"t": 1, "model": "chat", "step": "put-away", "seconds": -1},'
        ' {"t": true, "model": "chat", "step": "put-away", "seconds": 1},'
        ' {"t": 1, "model": ["chat"], "step": "put-away", "seconds": 1}, 7, null]'
    )
    assert ended(switches([*hostile, good]), {"chat"}) == [good]
    assert switches({"events": [good]}) == switches(None) == []


# A front door's /models answer whose events mix good ones with values not of their kind
# (json.loads reads Infinity, as the manager's reader does).
MIXED_EVENTS = """[
 {"t": 100, "text": "chat: brought in", "model": "chat", "step": "bring-in", "seconds": 2},
 {"t": 101.5, "text": "coder: put away", "model": "coder", "step": "put-away", "seconds": 0.5},
 {"t": 102, "text": "chat failed", "model": "chat", "step": null, "seconds": null},
 {"t": 103, "text": "a model no longer served", "model": "ghost", "step": "bring-in", "seconds": 1},
 {"t": 104, "text": {"html": "<b>"}, "model": "coder", "step": "<script>", "seconds": -1},
 {"t": Infinity, "text": "never", "model": "chat", "step": "bring-in", "seconds": 1},
 {"t": true, "text": "never", "model": "chat"}, {"text": "never", "model": "chat"},
 {"t": 105, "text": "never", "model": ["chat"]}, 7, null
]"""


@contextlib.contextmanager
def front_door(socket_path: Path, body: bytes) -> Iterator[None]:
    """Whoever answers on the control socket, with ``body`` for every request."""

    class Answer(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            self.request.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    socket_path.parent.mkdir(parents=True, exist_ok=True)
    with socketserver.ThreadingUnixStreamServer(str(socket_path), Answer) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield
        finally:
            server.shutdown()


@pytest.mark.anyio
async def test_the_status_route_shows_a_mixed_event_list_as_pinned(
    env: Env, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """/api/status's events, strip and cards' last switch from one parse of the front
    door's events: what is not of its kind is left out or unknown, never passed on (before,
    the events card got an infinite time as null, a time of true, and a dict's repr with a
    length of -1.00 s)."""
    runtime = tmp_path / "run"
    config = config_mod.parse(
        {
            "models": [
                {"path": str(env.models / "demo-a"), "served_name": "chat"},
                {"path": str(env.models / "demo-b"), "served_name": "coder"},
            ],
            "residency": {"runtime_dir": str(runtime)},
        }
    )
    config_mod.save(config, env.config_path)
    assert (await client.post("/api/service/start", headers=BEARER)).status_code == 200
    answer = f'{{"models": {{}}, "events": {MIXED_EVENTS}}}'.encode()
    with front_door(runtime / CONTROL_SOCKET, answer):
        response = await client.get("/api/status", headers=BEARER)
    assert response.status_code == 200, response.text
    status = response.json()
    assert status["control_error"] is None
    assert [e for e in status["events"] if e["t"] < 10**6] == [  # the unit's own are of now
        {"t": 100.0, "text": "chat: brought in (2.00 s)"},
        {"t": 101.5, "text": "coder: put away (0.50 s)"},
        {"t": 102.0, "text": "chat failed"},
        {"t": 103.0, "text": "a model no longer served (1.00 s)"},
        {"t": 104.0, "text": ""},
    ]
    assert status["switch_steps"] == [
        {"model": "chat", "step": "bring-in", "t": 100.0, "seconds": 2.0},
        {"model": "coder", "step": "put-away", "t": 101.5, "seconds": 0.5},
    ]
    assert {card["name"]: card["last_switch"] for card in status["models"]} == {
        "chat": {"t": 102.0, "text": "chat failed", "model": "chat", "step": None, "seconds": None},
        "coder": {"t": 104.0, "text": "", "model": "coder", "step": None, "seconds": None},
    }
