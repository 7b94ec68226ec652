"""Issue #38 item 5: what the manager needs to work with a server it did not start. The
login page says where this manager's token is (its file, or its terminal); the control
socket is found where a `serve` started by hand keeps it while the unit is down, as that
serve finds it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.manager.conftest import BEARER, TOKEN, Env
from vllm_offload import config as config_mod
from vllm_offload.box.prepare import control_socket
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.manager.state import Manager

pytestmark = pytest.mark.anyio


async def login_page(env: Env, token_file: Path | None) -> str:
    settings = ManagerSettings(
        config_path=env.config_path,
        token=TOKEN,
        unit="vllm",
        systemd=env.systemd,
        token_file=token_file,
    )
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        return (await client.get("/login")).text


async def test_the_login_page_says_where_the_token_is(env: Env, tmp_path: Path) -> None:
    by_hand = await login_page(env, None)
    assert "started without --token-file" in by_hand and "printed on the terminal" in by_hand
    assert "/etc/vllm-offload/manager-token" not in by_hand  # not where this one's is
    token_file = tmp_path / "my-token"
    assert f"in the token file {token_file}" in await login_page(env, token_file)


def test_the_control_socket_is_found_where_a_hand_run_serve_keeps_it(env: Env) -> None:
    manager = Manager(
        ManagerSettings(config_path=env.config_path, token=TOKEN, unit="vllm", systemd=env.systemd)
    )
    config = config_mod.load(env.config_path)
    # The unit is down: a `serve` this user ran keeps it where runtime_dir finds it.
    assert manager.control_socket(config) == control_socket(config, os.environ)
    assert not str(manager.control_socket(config)).startswith("/run/vllm-offload")


async def test_several_models_without_model_roots_keep_their_cards(
    env: Env, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Without manager.model_roots the roots are the models' own folders' parents, as for
    one model (they were the demo model's, so every [[models]] entry was outside them and
    the page hid the Models card behind a plan error)."""
    config = config_mod.parse(
        {
            "models": [
                {"path": str(env.models / "demo-a"), "served_name": "a"},
                {"path": str(env.models / "demo-b"), "served_name": "b"},
            ]
        }
    )
    config_mod.save(config, env.config_path)
    status = (await client.get("/api/status", headers=BEARER)).json()
    assert [card["name"] for card in status["models"]] == ["a", "b"], status["plan"]
