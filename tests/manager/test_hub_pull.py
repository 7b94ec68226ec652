"""Issue #38 item 3 through the manager: the page fetches a Hugging Face model the config
file's manager.hub_models allows (any other is 403), shows its progress, lists it among
the models once fetched and plans it. A real manager process against the loopback hub."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from testkit import stack
from tests.hub_server import Hub, serve_hub
from tests.model.test_hub import WEIGHTS, _repo
from vllm_offload import config as config_mod

TOKEN = "hub-pull-token-0123456789"


def wait_for(client: httpx.Client, state: str) -> dict[str, object]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        pulls = client.get("/api/hub/pulls").json()["pulls"]
        if pulls and pulls[-1]["state"] == state:
            return dict(pulls[-1])
        time.sleep(0.2)
    raise AssertionError(f"no pull reached {state!r}: {pulls}")


def test_the_manager_fetches_an_allowed_hub_model(tmp_path: Path, demo_dir: Path) -> None:
    hub = Hub(repos={"org/tiny": _repo()}, pause_after=11 * 1024 * 1024)
    deployment = stack.install(tmp_path, demo_dir)
    saved = config_mod.load(deployment.config)
    config_mod.save(
        config_mod.with_overrides(saved, {"manager.hub_models": ["org/*"]}), deployment.config
    )
    with serve_hub(hub) as endpoint:
        env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1"}
        with (
            stack.manager(tmp_path, deployment, TOKEN, env) as url,
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
            ) as manager,
        ):
            refused = manager.post("/api/hub/pull", json={"model": "other/model"})
            assert refused.status_code == 403
            assert "manager.hub_models" in refused.json()["detail"]["message"]
            # Issue #55: a listed repo's pull-request ref (anyone can open one) was fetched
            pr = manager.post("/api/hub/pull", json={"model": "org/tiny@refs/pr/1"})
            assert pr.status_code == 403, pr.text
            assert "org/name@revision" in pr.json()["detail"]["message"]
            assert manager.post("/api/hub/pull", json={"model": "org/tiny"}).status_code == 202
            assert hub.paused.wait(120)
            halfway = wait_for(manager, "fetching")  # what the page shows meanwhile
            deadline = time.monotonic() + 60

            def partway(pull: dict[str, object]) -> bool:
                return 0 < int(str(pull["fetched_bytes"])) < int(str(pull["total_bytes"]))

            # The small files may be counted whole before the paused weights' bar appears.
            while not partway(halfway) and time.monotonic() < deadline:
                halfway = wait_for(manager, "fetching")
            assert partway(halfway), halfway
            hub.go.set()
            done = wait_for(manager, "done")
            assert done["fetched_bytes"] == done["total_bytes"] > 2 * WEIGHTS
            models = manager.get("/api/models").json()["models"]
            assert {"name": "org/tiny (Hugging Face)", "path": "org/tiny"} in models
            config = manager.get("/api/config").json()["config"]
            config["model"]["path"] = "org/tiny"
            preview = manager.post("/api/config/preview", json={"config": config})
            assert preview.status_code == 200, preview.text
            assert preview.json()["plan"]["weight_bytes"] == 2 * WEIGHTS
            assert manager.post("/api/hub/pull", json={"model": "org/nope"}).status_code == 202
            assert "org/nope: no such model" in str(wait_for(manager, "failed")["message"])


def test_hub_models_allow_a_revision_only_where_an_entry_names_it() -> None:
    from vllm_offload.manager.fence import allowed

    assert allowed("org/tiny", ["org/*"])
    assert not allowed("org/tiny@refs/pr/1", ["org/*"])
    assert not allowed("org/tiny@main", ["org/*"])  # the default branch is named by none
    assert allowed("org/tiny@v1.0", ["org/*", "org/tiny@v1.*"])
    assert not allowed("org/tiny@v2.0", ["org/tiny@v1.*"])
    assert not allowed("org/tiny", ["org/tiny@v1.*"])
    assert allowed("org/tiny@refs/pr/1", ["org/*@*"])  # said in so many words
