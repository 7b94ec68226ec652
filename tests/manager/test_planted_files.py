"""Issue #29, item 4: files planted in the configured model's folder or the disk tier's
kept the manager's threads (a FIFO) or its memory (a link to /dev/zero) until /healthz
stopped answering; a config.json with 200,000,000 layers kept it busy for 12 minutes."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_host
from tests.manager.conftest import BEARER, Env
from vllm_offload import config as config_mod
from vllm_offload import disk_layout, hardware

pytestmark = pytest.mark.anyio
POLLS = 50  # the old manager stopped answering /healthz after about 40


async def poll_status(client: httpx.AsyncClient) -> list[httpx.Response]:
    """POLLS status requests at once, as pages polling do; each must answer."""
    requests = [client.get("/api/status", headers=BEARER) for _ in range(POLLS)]
    return await asyncio.wait_for(asyncio.gather(*requests), timeout=300)


async def test_a_fifo_weight_file_in_the_configured_model(
    client: httpx.AsyncClient, env: Env
) -> None:
    weights = env.models / "demo-a" / "model.safetensors"
    weights.unlink()
    os.mkfifo(weights)
    for response in await poll_status(client):
        assert response.status_code == 200
        assert "not a regular file" in response.json()["plan"]
    assert (await client.get("/healthz")).status_code == 200


async def test_a_fifo_or_dev_zero_status_file_in_the_disk_tier(
    client: httpx.AsyncClient, env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GPU host, so that the plan has a disk tier and the page reads its status file.
    monkeypatch.setattr(hardware, "probe", lambda: make_host(24))
    disk = tmp_path / "nvme"
    root = disk_layout.tier_root(str(disk))
    root.mkdir(parents=True)
    config = config_mod.load(env.config_path)
    config_mod.save(
        config_mod.with_overrides(
            config,
            {
                "kv_offload.disk_path": str(disk),
                "kv_offload.backend": "native",
                "kv_offload.cpu_tier_gib": 1,
            },
        ),
        env.config_path,
    )
    os.mkfifo(root / disk_layout.STATUS_FILE)
    for response in await poll_status(client):
        assert response.status_code == 200
        assert response.json()["plan"]["disk_tier_path"] == str(disk)
    (root / disk_layout.STATUS_FILE).unlink()
    (root / disk_layout.STATUS_FILE).symlink_to("/dev/zero")
    assert (await asyncio.wait_for(client.get("/api/status", headers=BEARER), 120)).is_success
    assert (await client.get("/healthz")).status_code == 200


async def test_a_config_with_200_million_layers_is_refused_at_once(
    client: httpx.AsyncClient, env: Env
) -> None:
    huge = env.models / "huge"
    huge.mkdir()
    config = json.loads((env.models / "demo-a" / "config.json").read_text())
    (huge / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=200_000_000)))
    body = (await client.get("/api/config", headers=BEARER)).json()["config"]
    body["model"]["path"] = str(huge)
    preview = client.post("/api/config/preview", json={"config": body}, headers=BEARER)
    response = await asyncio.wait_for(preview, timeout=120)
    assert response.status_code == 422
    assert response.json()["detail"]["field"] == "model.path"
    assert "num_hidden_layers" in response.json()["detail"]["message"]
