"""The front door's control routes, on a unix socket in its runtime directory (mode 0660,
the directory 0750: the server's user and its group, which the manager's unit joins):
the models' states (with since when, until when, the expected wait and the planned
memory) and the switches made, and bringing a model in or putting it away by hand, for
the manager's page and `vllm-offload ps`/`load`/`unload` alike. Never on the OpenAI port."""

from __future__ import annotations

from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException

from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import Refused
from vllm_offload.fleet.front import FrontDoor
from vllm_offload.fleet.outlook import outlook
from vllm_offload.fleet.prepare import several
from vllm_offload.fleet.residency import Event, Unavailable
from vllm_offload.systemd.control import ServiceError

EVENTS_KEPT = 200


def create_control_app(front: FrontDoor, events: deque[Event],
                       planned: dict[str, dict[str, int]] | None = None) -> FastAPI:  # fmt: skip
    """``planned``: each model's planned memory (``gpu_bytes``/``host_bytes`` by state:
    runner.planned_memory)."""
    app = FastAPI(title="vllm-offload front door control", docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip

    def known(name: str) -> str:
        if name not in front.engines:
            raise HTTPException(404, f"no model '{name}'; this server has: "
                                f"{', '.join(front.engines)}")  # fmt: skip
        return name

    @app.get("/models")
    def models() -> dict[str, Any]:
        books, times = front.residency.state(), outlook(front.residency)
        rows = {name: {**books[name], **times[name], "state": front.state_of(name),
                       "pid": front.engines[name].pid,
                       "max_model_len": front.max_model_len[name],
                       "planned": (planned or {}).get(name, {})}
                for name in front.engines}  # fmt: skip
        return {"models": rows, "ready": front.ready, "events": [asdict(e) for e in events]}

    @app.post("/models/{name}/bring-in")
    async def bring_in(name: str) -> dict[str, str]:
        try:
            await front.residency.bring_in(known(name))
        except Unavailable as exc:
            raise HTTPException(503, str(exc)) from None
        return {"status": f"'{name}' is on the GPU"}

    @app.post("/models/{name}/put-away")
    async def put_away(name: str) -> dict[str, str]:
        await front.residency.put_away(known(name))
        return {"status": f"'{name}' is away"}

    return app


def _client(socket: Path, timeout_s: float) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), base_url="http://front",
                        timeout=timeout_s)  # fmt: skip


def read_models(socket: Path, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """GET /models through the control socket; None where no front door answers there."""
    try:
        with _client(socket, timeout_s) as client:
            answer = client.get("/models")
            answer.raise_for_status()
            data: dict[str, Any] = answer.json()
            return data
    except (httpx.HTTPError, ValueError):
        return None


def move(socket: Path, name: str, action: str, timeout_s: float = 900.0) -> httpx.Response:
    """POST a bring-in or put-away; the front door's answer, whatever its status."""
    with _client(socket, timeout_s) as client:
        return client.post(f"/models/{name}/{action}")


def move_by_hand(config: DeploymentConfig, socket: Path, name: str, action: str,
                 timeout_s: float = 900.0) -> str:  # fmt: skip
    """Bring ``name`` in or put it away for a person (the manager's page, `vllm-offload
    load`/`unload`): the front door's words, or Refused (one model; no such model) or
    ServiceError (no front door there; the move failed)."""
    if not several(config):
        raise Refused("models", "one model is configured: it is always on the GPU")
    try:
        answer = move(socket, name, action, timeout_s)
    except httpx.HTTPError as exc:
        raise ServiceError(f"the front door did not answer on {socket}: {exc}") from None
    if answer.status_code == 404:
        raise Refused("model", answer.json().get("detail", f"no model '{name}'"))
    if answer.status_code != 200:
        raise ServiceError(f"{action} '{name}': {answer.text[:300]}")
    status: str = answer.json()["status"]
    return status
