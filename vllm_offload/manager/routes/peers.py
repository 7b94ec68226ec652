"""More than one box: the other boxes of [cluster] and whether each answers now (its
/health, within a bound), so the page says which peers the router can reach."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from fastapi import APIRouter, Depends

from vllm_offload.config import DeploymentConfig
from vllm_offload.manager.state import Manager, manager_of
from vllm_offload.upstream.client import VllmClient

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]
PEER_TIMEOUT_S = 2.0  # each box's /health; they are asked at once, so a poll takes this long
MAX_PEERS_AT_ONCE = 8


def peer_states(config: DeploymentConfig) -> list[dict[str, Any]]:
    """Each box of [cluster]: its name, address, models and 'up' (/health 200) or 'down'."""
    boxes = config.cluster.boxes

    def state(url: str) -> str:
        with VllmClient(url, timeout_s=PEER_TIMEOUT_S) as box:
            return "up" if box.healthy() else "down"

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PEERS_AT_ONCE, len(boxes)))) as pool:
        states = list(pool.map(state, [box.url for box in boxes]))
    return [
        {"name": box.name, "url": box.url, "models": box.models, "state": state}
        for box, state in zip(boxes, states, strict=True)
    ]


@router.get("/api/peers")
def peers(manager: Shared) -> dict[str, Any]:
    """The boxes of [cluster] (file only) and their state; empty without a cluster."""
    return {"peers": peer_states(manager.load())}
