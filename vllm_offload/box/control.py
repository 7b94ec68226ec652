"""The front door's control routes, on a unix socket in its runtime directory (mode 0660,
the directory 0750: the server's user and its group, which the manager's unit joins):
the models' states (with since when, until when, the expected wait and the planned
memory) and the switches made, and bringing a model in or putting it away by hand, for
the manager's page and `vllm-offload ps`/`load`/`unload` alike. Never on the OpenAI port."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from fastapi import FastAPI, HTTPException

from vllm_offload.box.front import FrontDoor
from vllm_offload.box.outlook import outlook
from vllm_offload.box.residency_records import Event, Unavailable
from vllm_offload.errors import Refused
from vllm_offload.systemd.control import ServiceError

EVENTS_KEPT = 200
# The manager's reads: a front door answers /models in milliseconds (200 events is ~40 KB);
# a bring-in starts a model (minutes). Request threads are bounded by READERS and movers.
READ_DEADLINE_S = 3.0
MOVE_DEADLINE_S = 900.0
MAX_CONTROL_BYTES = 4 << 20
READERS = 2
_readers = threading.BoundedSemaphore(READERS)
_movers = threading.BoundedSemaphore(1)


def create_control_app(
    front: FrontDoor,
    events: deque[Event],
    planned: dict[str, dict[str, int]] | None = None,
    gpus: Mapping[str, tuple[int, ...]] | None = None,
) -> FastAPI:
    """``planned``: each model's planned memory (``gpu_bytes``/``host_bytes`` by state:
    runner.planned_memory); ``gpus``: the GPUs each engine runs on (plan.placement; none
    on a CPU host)."""
    app = FastAPI(
        title="vllm-offload front door control", docs_url=None, redoc_url=None, openapi_url=None
    )

    def known(name: str) -> str:
        if name not in front.engines:
            raise HTTPException(
                404, f"no model '{name}'; this server has: {', '.join(front.engines)}"
            )
        return name

    @app.get("/models")
    def models() -> dict[str, Any]:
        books, times = front.residency.state(), outlook(front.residency)
        rows = {
            name: {
                **books[name],
                **times[name],
                "state": front.state_of(name),
                "pid": front.engines[name].pid,
                "max_model_len": front.max_model_len[name],
                "planned": (planned or {}).get(name, {}),
                "gpus": list((gpus or {}).get(name, ())),
            }
            for name in front.engines
        }
        return {"models": rows, "ready": front.ready, "events": [asdict(e) for e in events]}

    @app.post("/models/{name}/bring-in")
    async def bring_in(name: str) -> dict[str, str]:
        try:
            await front.residency.bring_in(known(name))
        except Unavailable as exc:
            raise HTTPException(503, str(exc)) from None
        on_gpu = (planned or {}).get(name, {}).get("gpu_bytes_serving")
        return {"status": f"'{name}' is {'on the GPU' if on_gpu != 0 else 'serving'}"}

    @app.post("/models/{name}/put-away")
    async def put_away(name: str) -> dict[str, str]:
        await front.residency.put_away(known(name))
        return {"status": f"'{name}' is away"}

    return app


class ControlError(Exception):
    """The control socket answered, but not as a front door does: too slowly, too much, or
    not JSON. Whoever runs as the server's user can answer there, so its answer is
    untrusted: every read has one deadline and a size cap."""


def _call(socket: Path, method: str, path: str, deadline_s: float) -> tuple[int, Any]:
    """(status, JSON body) of one request, the whole exchange (connect, headers, body)
    within ``deadline_s`` and its body at most MAX_CONTROL_BYTES; ControlError otherwise,
    httpx.HTTPError where nothing answers. Called from a thread, not an event loop."""

    async def exchange() -> tuple[int, bytes]:
        transport = httpx.AsyncHTTPTransport(uds=str(socket))
        async with (
            # No timeout of httpx's own (5 s a read): the deadline above is the one bound.
            httpx.AsyncClient(transport=transport, base_url="http://front", timeout=None) as client,
            client.stream(method, path) as response,
        ):
            body = bytearray()
            async for part in response.aiter_bytes():
                body += part
                if len(body) > MAX_CONTROL_BYTES:
                    raise ControlError(f"an answer over {MAX_CONTROL_BYTES} bytes")
            return response.status_code, bytes(body)

    try:
        status, body = asyncio.run(asyncio.wait_for(exchange(), deadline_s))
    except TimeoutError:  # a byte at a time, headers included, ends here too
        raise ControlError(f"no whole answer within {deadline_s:.0f} s") from None
    try:
        return status, json.loads(body)
    except (ValueError, RecursionError):
        raise ControlError("an answer that is not JSON") from None


def read_models(socket: Path, deadline_s: float = READ_DEADLINE_S) -> dict[str, Any] | str:
    """GET /models through the control socket, or why not (nothing listening there, or an
    answer no front door gives). At most READERS at once: a caller past them is told so at
    once instead of waiting behind a socket that does not answer."""
    if not _readers.acquire(blocking=False):
        return f"{READERS} reads of {socket} are still waiting for it"
    try:
        status, data = _call(socket, "GET", "/models", deadline_s)
    except httpx.HTTPError as exc:
        return f"nothing answers on {socket} ({exc})"
    except ControlError as exc:
        return f"{socket}: {exc}"
    finally:
        _readers.release()
    if status != 200 or not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        return f"{socket}: not a front door's answer (HTTP {status})"
    return data


def move(
    socket: Path, name: str, action: str, deadline_s: float = MOVE_DEADLINE_S
) -> tuple[int, Any]:
    """POST a bring-in or put-away: the front door's (status, JSON answer), whatever the
    status; one at a time (a second is refused with ControlError at once)."""
    if not _movers.acquire(blocking=False):
        raise ControlError("another bring-in or put-away is under way; try again after it")
    try:
        return _call(socket, "POST", f"/models/{quote(name, safe='')}/{action}", deadline_s)
    finally:
        _movers.release()


def move_by_hand(socket: Path, name: str, action: str) -> str:
    """Bring ``name`` in or put it away for a person (the manager's page, `vllm-offload
    load`/`unload`) through the front door on ``socket``: its words, or Refused (no such
    model) or ServiceError (no front door there; the move failed or the answer was not
    one). The front door knows its models: no config is asked (issue #56: without
    --config, `load` read the defaults, one model, and refused what `ps` had listed)."""
    try:
        status, answer = move(socket, name, action)
    except httpx.HTTPError as exc:
        raise ServiceError(f"the front door did not answer on {socket}: {exc}") from None
    except ControlError as exc:
        raise ServiceError(f"{action} '{name}': {socket}: {exc}") from None
    said = answer.get("detail") or answer.get("status") if isinstance(answer, dict) else None
    if status == 404:
        raise Refused("model", str(said or f"no model '{name}'")[:300])
    if status != 200 or not isinstance(said, str):
        raise ServiceError(f"{action} '{name}': HTTP {status}: {str(said)[:300]}")
    return said[:300]
