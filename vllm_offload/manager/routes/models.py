"""Models: with several, bring one onto the GPU or put one away by hand, through the
front door's control socket (never its OpenAI port); and fetch a Hugging Face model the
config file's manager.hub_models allows, with its progress."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from vllm_offload.box.control import move_by_hand
from vllm_offload.box.prepare import several
from vllm_offload.errors import Refused
from vllm_offload.manager.fence import hub_model
from vllm_offload.manager.state import Manager, manager_of

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]


@router.post("/api/models/{name}/{action}")
def move_model(
    manager: Shared, name: str, action: Literal["bring-in", "put-away"]
) -> dict[str, str]:
    config = manager.load()
    if not several(config):
        raise Refused("models", "one model is configured: it is always on the GPU")
    try:
        return {"status": move_by_hand(manager.control_socket(config), name, action)}
    finally:
        manager.monitor.changed()


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
