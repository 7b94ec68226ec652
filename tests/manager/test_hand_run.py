"""Issue #38 item 5: what the manager needs to work with a server it did not start. The
login page says where this manager's token is (its file, or its terminal); the control
socket is found where a `serve` started by hand keeps it while the unit is down, as that
serve finds it."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.manager.conftest import TOKEN, Env
from vllm_offload import config as config_mod
from vllm_offload.fleet.prepare import control_socket
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.manager.state import Manager

pytestmark = pytest.mark.anyio


async def login_page(env: Env, token_file: Path | None) -> str:
    settings = ManagerSettings(env.config_path, TOKEN, "vllm", env.systemd, token_file=token_file)
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
    manager = Manager(ManagerSettings(env.config_path, TOKEN, "vllm", env.systemd))
    config = config_mod.load(env.config_path)
    # The unit is down: a `serve` this user ran keeps it where runtime_dir finds it.
    assert manager.control_socket(config) == control_socket(config, os.environ)
    assert not str(manager.control_socket(config)).startswith("/run/vllm-offload")
