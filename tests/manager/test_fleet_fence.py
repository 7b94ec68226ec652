"""Issue #31: several models through the manager's API. Each [[models]] entry is fenced as
the single model is: its own disk tier and non-tuning flags only from the file, its path
inside the model roots; a refusal names the entry's field and leaves the file as it was."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.manager.conftest import BEARER, Env

pytestmark = pytest.mark.anyio


async def put_models(client: httpx.AsyncClient, env: Env, second: dict[str, Any]) -> httpx.Response:
    config = (await client.get("/api/config", headers=BEARER)).json()["config"]
    config["model"] = {}  # with [[models]], every model is given there
    config["models"] = [
        {"path": str(env.models / "demo-a"), "served_name": "a"},
        {"path": str(env.models / "demo-b"), "served_name": "b", **second},
    ]
    return await client.put("/api/config", json={"config": config}, headers=BEARER)


@pytest.mark.parametrize(
    ("second", "status", "field", "words"),
    [
        (
            {"kv_offload": {"disk_path": "/etc"}},
            403,
            "models[1].kv_offload.disk_path",
            "administrator",
        ),
        ({"extra_args": ["--trust-remote-code"]}, 403, "models[1].extra_args", "administrator"),
        (
            {"extra_args": ["--chat-template=/etc/passwd"]},
            403,
            "models[1].extra_args",
            "tuning flags",
        ),
        ({"path": "/etc"}, 422, "models[1].path", "outside the model roots"),
        ({"path": "demo-b"}, 422, "models[1].path", "absolute path"),
        # A hub id would download at a client's word: only the file names one (#38).
        ({"path": "org/name"}, 403, "models[1].path", "vllm-offload pull org/name"),
    ],
)
async def test_each_model_is_fenced_like_the_one(
    client: httpx.AsyncClient,
    env: Env,
    second: dict[str, Any],
    status: int,
    field: str,
    words: str,
) -> None:
    before = env.config_path.read_bytes()
    response = await put_models(client, env, second)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert detail["field"] == field and words in detail["message"], detail
    assert env.config_path.read_bytes() == before


async def test_two_models_inside_the_fence_are_saved(client: httpx.AsyncClient, env: Env) -> None:
    response = await put_models(client, env, {"extra_args": ["--max-num-seqs=4"]})
    assert response.status_code == 202, response.text
    assert set(response.json()["plan"]["models"]) == {"a", "b"}
    assert "[[models]]" in env.config_path.read_text()
