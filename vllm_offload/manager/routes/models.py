"""Models: with several, bring one onto the GPU or put one away by hand, through the
front door's control socket (never its OpenAI port); and fetch a Hugging Face model the
config file's manager.hub_models allows, with its progress."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import httpx
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from vllm_offload.errors import Refused
from vllm_offload.fleet.control import move
from vllm_offload.fleet.prepare import several
from vllm_offload.manager.fence import hub_model
from vllm_offload.manager.state import Manager, manager_of
from vllm_offload.systemd.control import ServiceError

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]
MOVE_TIMEOUT_S = 900.0  # a stopped model is started: minutes


@router.post("/api/models/{name}/{action}")
def move_model(manager: Shared, name: str,
               action: Literal["bring-in", "put-away"]) -> dict[str, str]:  # fmt: skip
    config = manager.load()
    if not several(config):
        raise Refused("models", "one model is configured: it is always on the GPU")
    socket = manager.control_socket(config)
    try:
        answer = move(socket, name, action, MOVE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise ServiceError(f"the front door did not answer on {socket}: {exc}") from None
    finally:
        manager.monitor.changed()
    if answer.status_code == 404:
        raise Refused("model", answer.json().get("detail", f"no model '{name}'"))
    if answer.status_code != 200:
        raise ServiceError(f"{action} '{name}': {answer.text[:300]}")
    return {"status": answer.json()["status"]}


class PullBody(BaseModel):
    model: str = Field(max_length=300)


@router.post("/api/hub/pull", status_code=202)
def pull_model(manager: Shared, body: PullBody) -> dict[str, Any]:
    """Fetch a hub id into the manager's HF cache (403 unless manager.hub_models allows
    it); GET /api/hub/pulls follows it."""
    ref = hub_model("model", body.model.strip(), manager.load().manager.hub_models)
    return manager.pulls.start(ref)


@router.get("/api/hub/pulls")
def pulls(manager: Shared) -> dict[str, Any]:
    return {"pulls": manager.pulls.all()}
