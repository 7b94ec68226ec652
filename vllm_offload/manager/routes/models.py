"""Several models: bring one onto the GPU, or put one away, by hand, through the front
door's control socket (never its OpenAI port)."""

from __future__ import annotations

from typing import Annotated, Literal

import httpx
from fastapi import APIRouter, Depends

from vllm_offload.errors import Refused
from vllm_offload.fleet.control import ControlError, move
from vllm_offload.fleet.prepare import several
from vllm_offload.manager.state import Manager, manager_of
from vllm_offload.systemd.control import ServiceError

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]


@router.post("/api/models/{name}/{action}")
def move_model(manager: Shared, name: str,
               action: Literal["bring-in", "put-away"]) -> dict[str, str]:  # fmt: skip
    config = manager.load()
    if not several(config):
        raise Refused("models", "one model is configured: it is always on the GPU")
    socket = manager.control_socket(config)
    try:
        status, answer = move(socket, name, action)
    except httpx.HTTPError as exc:
        raise ServiceError(f"the front door did not answer on {socket}: {exc}") from None
    except ControlError as exc:
        raise ServiceError(f"{action} '{name}': {socket}: {exc}") from None
    finally:
        manager.monitor.changed()
    said = answer.get("detail") or answer.get("status") if isinstance(answer, dict) else None
    if status == 404:
        raise Refused("model", str(said or f"no model '{name}'")[:300])
    if status != 200 or not isinstance(said, str):
        raise ServiceError(f"{action} '{name}': HTTP {status}: {str(said)[:300]}")
    return {"status": said[:300]}
