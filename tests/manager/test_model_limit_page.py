"""Issue #38: the page refuses a max_model_len past the model's limit as `serve` does (vLLM
would die at start-up with it, and the unit restart into its start limit)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.manager.conftest import BEARER, Env
from vllm_offload.model.demo import MAX_POSITIONS

pytestmark = pytest.mark.anyio


async def test_preview_past_the_model_limit_is_422_naming_it(
    client: httpx.AsyncClient, env: Env
) -> None:
    body = (await client.get("/api/config", headers=BEARER)).json()["config"]
    body["model"]["max_model_len"] = MAX_POSITIONS + 1
    preview = client.post("/api/config/preview", json={"config": body}, headers=BEARER)
    response = await asyncio.wait_for(preview, timeout=120)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert detail["field"] == "model.max_model_len"
    assert f"past the model's limit of {MAX_POSITIONS:,}" in detail["message"]
    body["model"]["allow_long_max_model_len"] = True
    preview = client.post("/api/config/preview", json={"config": body}, headers=BEARER)
    response = await asyncio.wait_for(preview, timeout=120)
    assert response.status_code == 200, response.text
