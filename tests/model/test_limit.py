"""Issue #38: a max_model_len past the model's own limit (as vLLM derives it) is refused, or
passed on purpose through model.allow_long_max_model_len (vLLM's
VLLM_ALLOW_LONG_MAX_MODEL_LEN)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.shapes import GEMMA3_4B_TEXT, LLAMA3_8B, QWEN3_30B_A3B, write_shape
from vllm_offload import launch
from vllm_offload.cli import main
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import make_plan

LLAMA31_8B = Path(__file__).parents[2] / "benchmarks/models/llama-3.1-8b"
LINEAR_ROPE = dict(
    LLAMA3_8B, max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4.0}
)
YARN = dict(
    QWEN3_30B_A3B,
    max_position_embeddings=131072,
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
)
NO_KEY = {k: v for k, v in LLAMA3_8B.items() if k != "max_position_embeddings"}
SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": LLAMA3_8B,
    "linear-rope": LINEAR_ROPE,
    "yarn": YARN,
    "gemma3": GEMMA3_4B_TEXT,
    "seq-length": dict(NO_KEY, seq_length=2048, n_positions=1024),
    "llama3.1": json.loads((LLAMA31_8B / "config.json").read_text()),
}
EXPECTED = {
    "llama3-8b": 8192,
    "linear-rope": 16384,
    "yarn": 131072,
    "gemma3": 131072,
    "seq-length": 1024,
    "llama3.1": 131072,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_limit_is_vllms(tmp_path: Path, shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit read from config.json is the one vLLM's own ModelConfig derives."""
    from vllm.config import ModelConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_shape(tmp_path / shape, SHAPES[shape])
    facts = model_facts.read(model)
    assert facts.max_len_limit == EXPECTED[shape]
    vllm_limit = ModelConfig(model=str(model), skip_tokenizer_init=True).max_model_len
    assert facts.max_len_limit == vllm_limit


def test_the_tokenizers_model_max_length_is_not_a_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM reads the tokenizer's model_max_length only for pooling models."""
    from vllm.config import ModelConfig

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = write_shape(tmp_path, LINEAR_ROPE)
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2000}))
    assert model_facts.read(model).max_len_limit == 16384
    assert ModelConfig(model=str(model), skip_tokenizer_init=True).max_model_len == 16384


def test_past_the_limit_is_refused_naming_it_and_the_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    declared = ["plan", "--model", str(LLAMA31_8B), "--gpu-mem-gib", "80", "--ram-gib", "256"]
    assert main([*declared, "--model-max-model-len", "200000"]) == 2
    out = capsys.readouterr().out  # the refusal beside the plan with its fix, as serve --dry-run
    assert (
        "cannot start: model.max_model_len: 200000 tokens are past the model's limit of 131,072"
        in out
    )
    assert "model.allow_long_max_model_len = true" in out
    assert "the plan above is the one with model.max_model_len = 131072" in out
    assert (
        main(
            [
                *declared,
                "--model-max-model-len",
                "200000",
                "--model-allow-long-max-model-len",
                "true",
            ]
        )
        == 0
    )
    assert "past the model's limit" in capsys.readouterr().out  # still said, as a warning


def test_allowed_on_purpose_tells_vllm(tmp_path: Path) -> None:
    model = write_shape(tmp_path, LINEAR_ROPE)
    config = with_overrides(
        DeploymentConfig(),
        {
            "model.path": str(model),
            "model.max_model_len": 20000,
            "model.allow_long_max_model_len": True,
        },
    )
    plan = make_plan(config, model_facts.read(model), make_host(80, ram_gib=256), "cuda")
    spec = launch.build(config, plan, model)
    assert spec.env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] == "1"
    within = config.model_copy(
        update={"model": config.model.model_copy(update={"max_model_len": 16384})}
    )
    plan = make_plan(within, model_facts.read(model), make_host(80, ram_gib=256), "cuda")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in launch.build(within, plan, model).env
