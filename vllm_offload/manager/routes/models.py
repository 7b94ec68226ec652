"""Several models: bring one onto the GPU, or put one away, by hand, through the front
door's control socket (never its OpenAI port)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends

from vllm_offload.fleet.control import move_by_hand
from vllm_offload.manager.state import Manager, manager_of

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]


@router.post("/api/models/{name}/{action}")
def move_model(manager: Shared, name: str,
               action: Literal["bring-in", "put-away"]) -> dict[str, str]:  # fmt: skip
    config = manager.load()
    try:
        return {"status": move_by_hand(config, manager.control_socket(config), name, action)}
    finally:
        manager.monitor.changed()
