"""[cluster] (issue #44): the boxes behind the router, refused with the field and the fix;
the router's manifest and command line written from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from vllm_offload import cluster_router
from vllm_offload.config import ConfigError, DeploymentConfig, parse, save

TWO_BOXES = [
    {"name": "a", "url": "http://10.0.0.1:8000", "models": ["chat"]},
    {
        "name": "b",
        "url": "http://gpu2.lan:8000",
        "models": ["chat", "coder"],
        "model_urls": {"coder": "http://10.0.0.2:8000"},
    },
]


def test_each_box_and_model_is_one_worker_of_the_manifest(tmp_path: Path) -> None:
    cluster = parse({"cluster": {"boxes": TWO_BOXES}}).cluster
    path = tmp_path / "run" / "workers.json"
    cluster_router.write_manifest(cluster, path)
    assert json.loads(path.read_text()) == {
        "version": 1,
        "workers": [
            {"id": "a/chat", "url": "http://10.0.0.1:8000", "model_id": "chat"},
            {"id": "b/chat", "url": "http://gpu2.lan:8000", "model_id": "chat"},
            {"id": "b/coder", "url": "http://10.0.0.2:8000", "model_id": "coder"},
        ],
    }
    args = cluster_router.smg_args(cluster, path)
    assert "--policy=cache_aware" in args and f"--discovery-file={path}" in args
    assert all(a.startswith("--") for a in args)  # one token each: no value on its own
    # Issue #55: the metrics (no key) stay on loopback when the router listens everywhere
    everywhere = parse({"cluster": {"boxes": TWO_BOXES, "router_host": "0.0.0.0"}}).cluster
    args = cluster_router.smg_args(everywhere, path)
    assert "--host=0.0.0.0" in args and "--prometheus-host=127.0.0.1" in args


@pytest.mark.parametrize(
    ("boxes", "message"),
    [
        ([{**TWO_BOXES[1], "model_urls": {}}], "http://gpu2.lan:8000 already carries 'chat'"),
        ([{**TWO_BOXES[0], "url": "http://10.0.0.1:8000/"}], "no path, no trailing slash"),
        ([{**TWO_BOXES[0], "url": "10.0.0.1:8000"}], "is not http://host:port"),
        ([{**TWO_BOXES[0], "model_urls": {"coder": "http://x:1"}}], "'coder' is not one of"),
        ([TWO_BOXES[0], {**TWO_BOXES[0], "url": "http://x:1"}], "'a' names two boxes"),
        ([{**TWO_BOXES[0], "name": "A box"}], "use a-z, 0-9 and -"),
        ([{**TWO_BOXES[0], "models": []}], "at least 1 item"),
    ],
)
def test_a_bad_box_is_refused_naming_the_field(boxes: list[object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse({"cluster": {"boxes": boxes}})
    assert info.value.field.startswith("cluster") and message in str(info.value), info.value


def test_the_boxes_are_set_in_the_file_not_by_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_offload.cli import main

    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    text = capsys.readouterr().out
    assert "--cluster-router-port" in text and "--cluster-boxes" not in text


def test_without_boxes_the_router_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    save(DeploymentConfig(), config)
    with pytest.raises(SystemExit) as exited:
        cluster_router.main([f"--config={config}", f"--manifest={tmp_path / 'w.json'}"])
    assert exited.value.code == 2 and not (tmp_path / "w.json").exists()
    assert cluster_router.command(sys.executable, config, tmp_path / "w.json")[1:3] == [
        "-m",
        "vllm_offload.cluster_router",
    ]


def test_a_key_file_others_can_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = tmp_path / "api-key"
    key.write_text("k\n")
    key.chmod(0o644)
    config = tmp_path / "config.toml"
    save(parse({"cluster": {"boxes": TWO_BOXES, "api_key_file": str(key)}}), config)
    with pytest.raises(SystemExit) as exited:
        cluster_router.main([f"--config={config}", f"--manifest={tmp_path / 'w.json'}"])
    assert exited.value.code == 2 and "cluster.api_key_file" in capsys.readouterr().err
    assert not (tmp_path / "w.json").exists()
