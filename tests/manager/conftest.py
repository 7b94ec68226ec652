from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from vllm_offload import config as config_mod
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.systemd.control import Systemd

BIN = Path(sys.executable).parent
TOKEN = "test-token-0123456789abcdef"
UNIT = """[Unit]
Description=stand-in server for manager API tests
[Service]
ExecStart=/bin/sleep 600
Restart=on-failure
[Install]
WantedBy=multi-user.target
"""


@dataclass(kw_only=True)
class Env:
    config_path: Path
    models: Path
    root: Path
    systemd: Systemd


@pytest.fixture
def env(tmp_path: Path, demo_dir: Path) -> Iterator[Env]:
    """A real systemctl (systemctl3) controlling a stand-in unit, and a config whose model
    root holds two models."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(demo_dir, models / "demo-a")
    shutil.copytree(demo_dir, models / "demo-b")
    config_path = tmp_path / "etc" / "config.toml"
    config_mod.save(
        config_mod.with_overrides(
            config_mod.DeploymentConfig(),
            {
                "model.path": str(models / "demo-a"),
                "manager.model_roots": [str(models)],
                "server.port": 1,  # nothing listens: the sampler sees no server
            },
        ),
        config_path,
    )
    root = tmp_path / "a" / "b" / "root"
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "etc/systemd/system/vllm.service").write_text(UNIT)
    systemd = Systemd(
        systemctl=(str(BIN / "systemctl3"),), journalctl=(str(BIN / "journalctl3"),), root=root
    )
    yield Env(config_path=config_path, models=models, root=root, systemd=systemd)
    subprocess.run([str(BIN / "systemctl3"), f"--root={root}", "stop", "vllm.service"], timeout=60)


@pytest.fixture
async def client(env: Env) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        ManagerSettings(config_path=env.config_path, token=TOKEN, unit="vllm", systemd=env.systemd)
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def login(client: httpx.AsyncClient) -> str:
    """Log in through the form; returns the page's CSRF token."""
    response = await client.post(
        "/login", data={"token": TOKEN}, headers={"Origin": "http://testserver"}
    )
    assert response.status_code == 303
    page = await client.get("/")
    marker = '<meta name="csrf" content="'
    start = page.text.index(marker) + len(marker)
    return page.text[start : page.text.index('"', start)]
