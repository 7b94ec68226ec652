"""Issue #29, item 6: a model path resolved one way by the manager's root check and
another by the launcher served a model outside manager.model_roots. One resolution
(deployment.model_dir), used by the check, the launcher and the server's own start."""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_host
from tests.manager.conftest import BEARER, Env
from vllm_offload import config as config_mod
from vllm_offload import deployment
from vllm_offload.config import ConfigError

pytestmark = pytest.mark.anyio


async def put_model(client: httpx.AsyncClient, path: str) -> httpx.Response:
    config = (await client.get("/api/config", headers=BEARER)).json()["config"]
    config["model"]["path"] = path
    return await client.put("/api/config", json={"config": config}, headers=BEARER)


async def test_a_tilde_path_cannot_leave_the_roots(
    client: httpx.AsyncClient,
    env: Env,
    tmp_path: Path,
    demo_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``~user/../x``: the old check read it relative to the manager's working directory
    (inside the roots there), the launcher expanded ``~user`` (outside)."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(demo_dir, elsewhere)
    home = Path(f"~{getpass.getuser()}").expanduser()
    sneaky = f"~{getpass.getuser()}/" + "../" * len(home.parts) + str(elsewhere).lstrip("/")
    # where the old check looked: relative to the working directory, under the model root
    workdir = env.models.joinpath(*["d"] * (len(home.parts) - 1))
    workdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(workdir)
    shutil.copytree(demo_dir, env.models / str(elsewhere).lstrip("/"))
    before = env.config_path.read_bytes()
    response = await put_model(client, sneaky)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]["field"] == "model.path"
    assert env.config_path.read_bytes() == before
    # and the one resolution, as the server makes it at its own start
    saved = config_mod.load(env.config_path)
    outside = config_mod.with_overrides(saved, {"model.path": sneaky})
    assert deployment.model_dir(outside) == elsewhere
    with pytest.raises(ConfigError, match="outside the model roots"):
        deployment.prepare(outside, make_host(None), {}, None)


def test_the_server_checks_the_roots_at_its_own_start(tmp_path: Path, demo_dir: Path) -> None:
    """A folder inside the roots replaced by a link to elsewhere after it was chosen: the
    server resolves the path itself when it starts, and refuses."""
    models, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    models.mkdir()
    shutil.copytree(demo_dir, elsewhere)
    (models / "chosen").symlink_to(elsewhere)
    config = config_mod.with_overrides(
        config_mod.DeploymentConfig(),
        {"model.path": str(models / "chosen"), "manager.model_roots": [str(models)]},
    )
    with pytest.raises(ConfigError) as info:
        deployment.prepare(config, make_host(None), {}, None)
    assert info.value.field == "model.path" and info.value.exit_code == 2
    inside = config_mod.with_overrides(config, {"manager.model_roots": [str(tmp_path)]})
    prepared = deployment.prepare(inside, make_host(None), {}, None)
    assert prepared.spec.option("--model") == str(elsewhere)  # what was checked is served
    assert prepared.spec.option("--served-model-name") == "chosen"  # the link's own name
