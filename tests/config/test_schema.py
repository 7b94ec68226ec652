"""One rule for the name a model answers to (issue #45, item 2): `serve`'s
--served-model-name, the front door's key for a [[models]] entry and the manager's
cards all come from config.schema.model_name. Before, two rules disagreed for paths
like "." (the folder's name vs none) and for the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_host
from tests.shapes import LLAMA3_8B, write_shape
from vllm_offload import launch
from vllm_offload.config import DeploymentConfig, parse, with_overrides
from vllm_offload.config.schema import engine_configs, model_name
from vllm_offload.model import facts as model_facts
from vllm_offload.model import real as real_model
from vllm_offload.plan import make_plan


@pytest.mark.parametrize("written", [".", "./mymodel", "mymodel/", "~/mymodel"])
def test_serve_and_the_front_door_name_a_model_alike(
    written: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_shape(tmp_path / "mymodel", LLAMA3_8B)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(folder if written == "." else tmp_path)
    config = with_overrides(DeploymentConfig(), {"model.path": written})
    plan = make_plan(config, model_facts.read(folder), make_host(24), "cuda")
    spec = launch.build(config, plan, folder)
    assert spec.option("--served-model-name") == "mymodel" == model_name(config.model)
    other = write_shape(tmp_path / "other", LLAMA3_8B)
    several = parse({"models": [{"path": written}, {"path": str(other)}]})
    assert list(engine_configs(several)) == ["mymodel", "other"]


def test_the_default_model_answers_to_its_folder_s_name() -> None:
    assert model_name(DeploymentConfig().model) == real_model.DEFAULT_NAME
    assert real_model.default_dir().name == real_model.DEFAULT_NAME
