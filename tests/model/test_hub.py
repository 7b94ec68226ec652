"""A model named by its Hugging Face id: planned from the hub without a download, pulled
(resuming an interrupted download), served from the HF cache, and the hub's refusals said
plainly. The hub is tests/hub_server.py on loopback (HF_ENDPOINT); `vllm-offload` runs as
its own process, as a user runs it."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_server import GOOD_TOKEN, Hub, Repo, serve_hub
from tests.shapes import LLAMA3_8B

REPO_ROOT = Path(__file__).parents[2]
WEIGHTS = 12 * 1024 * 1024  # BF16 elements: 24 MiB, past huggingface_hub's 10 MB chunk


def _safetensors(elements: int, seed: int) -> bytes:
    header = json.dumps(
        {"w": {"dtype": "BF16", "shape": [elements], "data_offsets": [0, 2 * elements]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + random.Random(seed).randbytes(2 * elements)


def _repo(**kwargs: bool) -> Repo:
    config = dict(LLAMA3_8B, num_hidden_layers=2)
    return Repo(
        files={
            "config.json": json.dumps(config).encode(),
            "tokenizer_config.json": b"{}",
            "model.safetensors": _safetensors(WEIGHTS, 1),
            "original/consolidated.pth": b"x" * 1024,
        },
        **kwargs,
    )


@pytest.fixture
def hub() -> Hub:
    return Hub(repos={"org/tiny": _repo(), "org/gated": _repo(gated=True), "org/other": _repo()})


@pytest.fixture
def env(hub: Hub, tmp_path: Path) -> Iterator[dict[str, str]]:
    with serve_hub(hub) as endpoint:
        yield {
            **os.environ,
            "HF_ENDPOINT": endpoint,
            "HF_HOME": str(tmp_path / "hf"),
            "NO_PROXY": "127.0.0.1",
            "PYTHONPATH": str(REPO_ROOT),
        }


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vllm_offload", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _snapshots(env: dict[str, str], repo: str) -> Path:
    return Path(env["HF_HOME"]) / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots"


def test_plan_reads_the_hub_without_downloading(hub: Hub, env: dict[str, str]) -> None:
    run = _cli(env, "plan", "--model", "org/tiny", "--gpu-mem-gib", "24", "--json")
    assert run.returncode == 2, run.stderr  # it cannot start before a pull, and says so
    plan = json.loads(run.stdout)
    assert plan["weight_bytes"] == 2 * WEIGHTS and plan["weight_bytes_source"] == "safetensors"
    (problem,) = plan["problems"]
    assert problem["field"] == "model.path"
    assert "`vllm-offload pull org/tiny` fetches 0.02 GiB" in problem["message"]
    assert hub.gets("model.safetensors") == ["bytes=0-100000"]  # the header alone
    assert not _snapshots(env, "org/tiny").exists()  # nothing half-made in the HF cache


def test_several_hub_models_are_planned_from_the_hub(
    hub: Hub, env: dict[str, str], tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[[models]]\npath = "org/tiny"\n[[models]]\npath = "org/other"\n')
    run = _cli(env, "plan", "--config", str(config), "--gpu-mem-gib", "24", "--json")
    assert run.returncode == 2, run.stderr
    plan = json.loads(run.stdout)
    assert set(plan["models"]) == {"org/tiny", "org/other"}  # each answers to its repo id
    fields = [p["field"] for p in plan["problems"]]
    assert fields == ["models[0].path", "models[1].path"]
    assert set(hub.gets("model.safetensors")) == {"bytes=0-100000"}


def test_serve_does_not_download_on_start(hub: Hub, env: dict[str, str]) -> None:
    run = _cli(env, "serve", "--model", "org/tiny", "--dry-run")
    assert run.returncode == 2
    assert "org/tiny: not downloaded yet" in run.stderr
    assert "vllm-offload pull org/tiny" in run.stderr and "serve --pull" in run.stderr
    assert hub.requests == []
    asked = _cli(env, "serve", "--model", "org/tiny", "--dry-run", "--pull")
    assert f"pulled org/tiny into {_snapshots(env, 'org/tiny')}" in asked.stderr, asked.stderr
    assert "not downloaded" not in asked.stderr
    assert "--served-model-name=org/tiny" in asked.stdout, asked.stderr


def test_an_interrupted_pull_resumes(hub: Hub, env: dict[str, str]) -> None:
    hub.drop_after = 11 * 1024 * 1024  # the connection drops after 11 MiB of the weights
    run = _cli(env, "pull", "org/tiny")
    assert run.returncode == 0, run.stderr
    folder = Path(run.stdout.strip())
    assert folder.parent == _snapshots(env, "org/tiny")
    first, *rest = hub.gets("model.safetensors")
    # huggingface_hub keeps what reached the disk (10 MB chunks) and asks for the rest
    assert first == "" and rest == [f"bytes={10 * 1024 * 1024}-"]
    assert (folder / "model.safetensors").read_bytes() == hub.repos["org/tiny"].files[
        "model.safetensors"
    ]
    assert not (folder / "original").exists()  # the duplicate weights are left out
    # Planned from the download now, and it may start: no request reaches the hub.
    before = len(hub.requests)
    plan = _cli(env, "plan", "--model", "org/tiny", "--gpu-mem-gib", "24", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["model_path"] == str(folder)
    assert len(hub.requests) == before


def test_a_gated_repo_needs_a_token(env: dict[str, str]) -> None:
    run = _cli(env, "pull", "org/gated")
    assert run.returncode == 2
    assert "org/gated: the repo is gated" in run.stderr and "HF_TOKEN" in run.stderr
    assert _cli({**env, "HF_TOKEN": GOOD_TOKEN}, "pull", "org/gated").returncode == 0


def test_a_missing_repo_is_named(env: dict[str, str]) -> None:
    for args in (("pull", "org/nope"), ("plan", "--model", "org/nope")):
        run = _cli(env, *args)
        assert run.returncode == 2
        assert f"org/nope: no such model on {env['HF_ENDPOINT']}" in run.stderr
    revision = _cli(env, "pull", "org/tiny@v9")
    assert revision.returncode == 2 and "has no revision 'v9'" in revision.stderr


def test_offline_mode_says_so(hub: Hub, env: dict[str, str]) -> None:
    run = _cli({**env, "HF_HUB_OFFLINE": "1"}, "plan", "--model", "org/tiny")
    assert run.returncode == 1  # the environment, not the input
    assert "org/tiny: HF_HUB_OFFLINE is set, so nothing is asked of the hub" in run.stderr
    assert "cannot reach" not in run.stderr  # one cause, said once (issue #56)
    assert "a folder with the model's config.json plans without the hub" in run.stderr
    assert hub.requests == []


def test_an_unreachable_hub_is_the_same_exit_for_one_model_and_several(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Issue #56: exit 1 for one model, 2 for [[models]]; `pull` named model.path."""
    gone = {**env, "HF_ENDPOINT": "http://127.0.0.1:9"}
    one = _cli(gone, "plan", "--model", "org/tiny", "--gpu-mem-gib", "24")
    config = tmp_path / "two.toml"
    config.write_text('[[models]]\npath = "org/tiny"\n[[models]]\npath = "org/other"\n')
    several = _cli(gone, "plan", "--config", str(config), "--gpu-mem-gib", "24")
    assert one.returncode == several.returncode == 1, (one.stderr, several.stderr)
    assert "models[0].path: 'org/tiny'" in several.stderr
    pulled = _cli(gone, "pull", "org/tiny")
    assert pulled.returncode == 1 and "error: ID: org/tiny: cannot reach" in pulled.stderr


@pytest.mark.parametrize(
    ("hostile", "named"),
    [
        (dict(etag='"../../../../escaped"'), "etag"),
        (dict(etag='"../../../../escaped"', redirect=True), "etag"),  # from where it leads
        (dict(sha="../../../../escaped"), "a commit"),
        (dict(files={"config.json": b"{}", "../../../../escaped": b"x"}), "a file name"),
    ],
    ids=["etag", "etag-after-a-redirect", "commit", "file-name"],
)
def test_a_hostile_hub_writes_nothing_outside_the_cache(
    hostile: dict[str, object], named: str, tmp_path: Path
) -> None:
    """Issue #55: huggingface_hub put the hub's ETag into the blob's path and its commit
    id into the snapshot's, unchecked; a hub answering '../..' made `pull` write where it
    chose (here: beside HF_HOME). Each answer is checked before the library uses it."""
    repo = _repo()
    fields = {"files": {**repo.files, "model.safetensors": _safetensors(64, 2)}} | hostile
    hub = Hub(repos={"org/evil": Repo(**fields)})  # type: ignore[arg-type]
    home = tmp_path / "a" / "b" / "c" / "hf"
    with serve_hub(hub) as endpoint:
        env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HOME": str(home), "NO_PROXY": "127.0.0.1"}
        run = _cli(env, "pull", "org/evil")
    assert run.returncode != 0, run.stdout
    assert f"answered {named}" in run.stderr and "refused before anything was written" in run.stderr
    written = [p for p in tmp_path.rglob("*") if "escaped" in p.name]
    assert written == []


def test_an_endpoint_that_is_not_https_is_only_this_machine(env: dict[str, str]) -> None:
    """Over plain http anyone on the way answers as the hub (and HF_TOKEN crosses in clear)."""
    run = _cli({**env, "HF_ENDPOINT": "http://user:secret@hub.example:8080"}, "pull", "org/tiny")
    assert run.returncode == 2
    assert "HF_ENDPOINT=http://hub.example:8080: a hub is reached over https" in run.stderr
    assert "secret" not in run.stderr


def test_a_mirror_under_a_path_is_checked_as_the_hub() -> None:
    """Found in review: the JSON check read only paths that began with /api/, and a mirror
    serves the hub under a prefix (https://host/artifactory/api/huggingfaceml/repo)."""
    import httpx

    from vllm_offload.model import hub_guard

    endpoint = "https://mirror.lan/artifactory/api/huggingfaceml/hf"
    info = httpx.URL(endpoint + "/api/models/org/x/revision/main")
    assert hub_guard.is_api(endpoint, info)
    assert not hub_guard.is_api(endpoint, httpx.URL("https://cdn.example/api/models/org/x"))
    with pytest.raises(hub_guard.HubAnswerRefused, match="a commit"):
        hub_guard.check_answer(endpoint, info, {}, json.dumps({"sha": "../../x"}).encode())
