"""A vision encoder's start-up profile in the plan (issue #46): vLLM encodes one item as
large as its encoder budget before it measures the KV pool, so the plan takes that pass's
activations from the pool. Checked against vLLM 0.33.0 on an H200 at three image budgets
(a Qwen2.5-VL-7B shape, benchmarks/results/vlm-h200-vllm-0.33.0/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_offload.cli import main
from vllm_offload.model import vision as vision_profile

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "benchmarks/results/vlm-h200-vllm-0.33.0"
GIB = 1 << 30
# each run's max_pixels and its raw file ('gpu' arm: everything on the GPU)
RUNS = {
    1_003_520: RESULTS / "encoder-profile/vlm-1m/vlm_parts.json",
    9_633_792: RESULTS / "encoder-profile/vlm-9.6m/vlm_parts.json",
    12_845_056: RESULTS / "vlm_parts.json",
}


def vlm_folder(tmp_path: Path, preprocessor: str | None) -> Path:
    folder = tmp_path / "qwen2.5-vl-7b"
    folder.mkdir()
    config = (ROOT / "benchmarks/models/qwen2.5-vl-7b/config.json").read_text()
    (folder / "config.json").write_text(config)
    if preprocessor is not None:
        (folder / "preprocessor_config.json").write_text(preprocessor)
    return folder


def plan_json(capsys: pytest.CaptureFixture[str], folder: Path) -> dict[str, Any]:
    """The plan the GPU run's arm asked for (vlm_parts.py), on the H200's 139.8 GiB."""
    flags = ["--kv-offload-backend", "none", "--model-max-model-len", "8192"]
    flags += ["--gpu-memory-utilization", "0.42", "--gpu-mem-gib", "139.8", "--ram-gib", "125"]
    assert main(["plan", "--model", str(folder), *flags, "--json"]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)
    return plan


@pytest.mark.parametrize("max_pixels", sorted(RUNS))
def test_the_pool_planned_is_one_vllm_gave_at_each_image_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], max_pixels: int
) -> None:
    """Without the encoder's profile the plan said 41.83 GiB at all three; vLLM gave
    40.05, 39.58 and 39.03."""
    run = json.loads(RUNS[max_pixels].read_text())
    served = run["arms"]["gpu"]["kv_cache_gib_logged"]
    plan = plan_json(capsys, vlm_folder(tmp_path, json.dumps({"max_pixels": max_pixels})))
    planned = plan["gpu_kv_pool_bytes"] / GIB
    assert served - 0.3 < planned <= served, (planned, served)
    assert plan["vision_max_pixels_read"] is True
    assert plan["vision_encoder_profile_tokens"] == max(8192, max_pixels // 28**2)


@pytest.mark.parametrize(
    "preprocessor",
    [None, "{not json", '{"max_pixels": true}', '{"max_pixels": -5}', '{"max_pixels": 1e40}'],
)
def test_no_max_pixels_to_read_plans_the_largest_image_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], preprocessor: str | None
) -> None:
    """An absent, malformed or out-of-range file is untrusted input that says nothing:
    the plan takes the published processors' 12,845,056 pixels (16,384 tokens) and says
    it did."""
    folder = vlm_folder(tmp_path, preprocessor)
    plan = plan_json(capsys, folder)
    assert plan["vision_max_pixels_read"] is False
    assert plan["vision_encoder_profile_tokens"] == 16384
    assert main(["plan", "--model", str(folder), "--gpu-mem-gib", "24", "--ram-gib", "64"]) == 0
    assert "no max_pixels read: planned at 12,845,056 pixels" in capsys.readouterr().out


def test_the_newer_processor_files_name_it_size_longest_edge() -> None:
    vc = {"hidden_size": 1280, "intermediate_size": 3420, "spatial_merge_size": 2}
    profile = vision_profile.read("qwen2_5_vl", vc, {"size": {"longest_edge": 1_003_520}})
    assert profile is not None and profile.max_item_tokens == 1280


def test_qwen2_vl_is_embed_dim_wide_and_other_models_have_no_profile() -> None:
    profile = vision_profile.read("qwen2_vl", {"embed_dim": 1280, "mlp_ratio": 4}, None)
    assert profile is not None and (profile.width, profile.intermediate) == (1280, 5120)
    assert vision_profile.read("llama", {"hidden_size": 1280}, None) is None
    assert vision_profile.read("qwen2_5_vl", {"hidden_size": "wide"}, None) is None


def test_another_family_s_encoder_is_planned_without_it_and_plan_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "llava"
    folder.mkdir()
    text = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}
    text |= {"num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336}
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}
    config |= {"vision_config": {"hidden_size": 1024, "intermediate_size": 4096}}
    config |= {"text_config": text | {"vocab_size": 32064, "max_position_embeddings": 4096}}
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["plan", "--model", str(folder), "--gpu-mem-gib", "24", "--ram-gib", "64"]) == 0
    said = capsys.readouterr()
    assert "vision encoder's start-up profile of model_type 'llava'" in said.out + said.err
