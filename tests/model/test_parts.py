"""A multi-part model's components and weights_offload.params validated against them
(issue #46), on Qwen2.5-VL-7B-Instruct's real config.json
(benchmarks/models/qwen2.5-vl-7b, SOURCE.md there says where it came from) and on
safetensors headers written as its checkpoints name their tensors."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from vllm_offload.cli import main
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.model import facts as model_facts
from vllm_offload.model.config_json import ModelFactsError
from vllm_offload.plan import make_plan
from vllm_offload.plan.budget import decoder_layer_bytes

QWEN25_VL_7B = Path(__file__).parents[2] / "benchmarks/models/qwen2.5-vl-7b"
PLAN = ["plan", "--gpu-mem-gib", "24", "--ram-gib", "64", "--model-max-model-len", "32768"]


def params_of(facts: model_facts.ModelFacts) -> dict[str, float]:
    return {part.name: part.bytes / facts.dtype_bytes for part in facts.components}


def test_qwen25_vl_7b_components_from_its_config_json() -> None:
    """The published counts: 8.29 B parameters in all (the model card), of which the vision
    tower with its merger 0.68 B (32 blocks of 1280 with a 3420-wide gated MLP, the
    5120->5120->3584 merger) and the language model 7.62 B; within 1.5 %."""
    facts = model_facts.read(QWEN25_VL_7B)
    assert [(p.name, p.kind) for p in facts.components] == [
        ("visual", "vision tower"),
        ("visual.merger", "projector"),
        ("language_model", "language model"),
    ]
    params = params_of(facts)
    assert params["visual"] + params["visual.merger"] == pytest.approx(0.676e9, rel=0.015)
    assert params["visual.merger"] == pytest.approx(0.0446e9, rel=0.015)
    assert params["language_model"] == pytest.approx(7.62e9, rel=0.015)
    # the towers sit on the GPU too: the weights count them (not the text model alone)
    assert facts.weight_bytes / 2 == pytest.approx(8.29e9, rel=0.01)
    assert facts.weight_bytes == sum(p.bytes for p in facts.components)


def tensor(shape: list[int]) -> dict[str, Any]:
    return {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]}


def tiny_qwen25_vl_headers(new_names: bool) -> dict[str, dict[str, Any]]:
    """A 2-block, 2-layer Qwen2.5-VL checkpoint's tensors as transformers saves them
    (>= 4.52: under model.visual / model.language_model; before: visual / model)."""
    vis, lm = ("model.visual.", "model.language_model.") if new_names else ("visual.", "model.")
    tensors = {f"{vis}patch_embed.proj.weight": tensor([16, 3, 2, 14, 14])}
    for i in range(2):
        block = f"{vis}blocks.{i}."
        for name, shape in {
            "norm1.weight": [16],
            "attn.qkv.weight": [48, 16],
            "attn.qkv.bias": [48],
            "attn.proj.weight": [16, 16],
            "mlp.gate_proj.weight": [40, 16],
            "mlp.up_proj.weight": [40, 16],
            "mlp.down_proj.weight": [16, 40],
        }.items():
            tensors[block + name] = tensor(shape)
        layer = f"{lm}layers.{i}."
        for name, shape in {
            "input_layernorm.weight": [32],
            "self_attn.q_proj.weight": [32, 32],
            "self_attn.k_proj.weight": [8, 32],
            "self_attn.v_proj.weight": [8, 32],
            "self_attn.o_proj.weight": [32, 32],
            "mlp.gate_proj.weight": [64, 32],
            "mlp.up_proj.weight": [64, 32],
            "mlp.down_proj.weight": [32, 64],
        }.items():
            tensors[layer + name] = tensor(shape)
    tensors[f"{vis}merger.ln_q.weight"] = tensor([16])
    tensors[f"{vis}merger.mlp.0.weight"] = tensor([64, 64])
    tensors[f"{lm}embed_tokens.weight"] = tensor([100, 32])
    tensors["lm_head.weight"] = tensor([100, 32])
    return {"model.safetensors": tensors}


def write_header(path: Path, header: dict[str, Any]) -> None:
    data = json.dumps(header).encode()
    path.write_bytes(len(data).to_bytes(8, "little") + data)


@pytest.mark.parametrize("new_names", [True, False], ids=["model.visual", "visual"])
def test_components_from_safetensors_headers(tmp_path: Path, new_names: bool) -> None:
    shutil.copy(QWEN25_VL_7B / "config.json", tmp_path / "config.json")
    write_header(
        tmp_path / "model.safetensors", tiny_qwen25_vl_headers(new_names)["model.safetensors"]
    )
    facts = model_facts.read(tmp_path)
    parts = {p.name: p for p in facts.components}
    assert list(parts) == ["visual", "visual.merger", "language_model"]
    merger = (16 + 64 * 64) * 2
    vision = (16 * 3 * 2 * 14 * 14 + 2 * (16 + 48 * 16 + 48 + 16 * 16 + 3 * 40 * 16)) * 2
    assert parts["visual.merger"].bytes == merger
    assert parts["visual"].bytes == vision
    assert facts.weight_bytes == sum(p.bytes for p in parts.values())
    # the names vLLM's offloader matches: the tower's under its module name, a decoder
    # layer's relative to the layer, as vLLM fuses them
    assert "visual.blocks.1.mlp.gate_up_proj.weight" in parts["visual"].param_names
    assert "visual.merger.mlp.0.weight" in parts["visual.merger"].param_names
    assert parts["language_model"].param_names == (
        "input_layernorm.weight",
        "mlp.down_proj.weight",
        "mlp.gate_up_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.qkv_proj.weight",
    )


def config_for(**overrides: Any) -> DeploymentConfig:
    return with_overrides(
        DeploymentConfig(),
        {"model.path": str(QWEN25_VL_7B), "model.max_model_len": 32768, **overrides},
    )


@pytest.mark.parametrize(
    ("pattern", "takes"),
    [
        ("visual", ["visual", "visual.merger"]),
        ("merger", ["visual.merger"]),
        ("blocks.0", ["visual"]),
        ("mlp", ["visual", "visual.merger", "language_model"]),  # segments match anywhere
        ("self_attn.qkv_proj", ["language_model"]),
    ],
)
def test_a_matching_pattern_is_accepted(pattern: str, takes: list[str]) -> None:
    config = config_for(**{"weights_offload.params": [pattern], "weights_offload.cpu_gib": 0.05})
    plan = make_plan(config, model_facts.read(QWEN25_VL_7B), make_host(24, ram_gib=64), "cuda")
    assert plan.notes.problems == ()
    [decision] = [d for d in plan.notes.decisions if d.startswith("weights_offload.params")]
    assert [name for name in takes if f"{name!r} (" in decision] == takes
    assert [c["name"] for c in plan.weights.components] == [
        "visual",
        "visual.merger",
        "language_model",
    ]


@pytest.mark.parametrize("pattern", ["language_model", "model.layers.0", "q_proj", "vision_tower"])
def test_a_pattern_matching_nothing_is_refused_naming_the_components(
    pattern: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--model", str(QWEN25_VL_7B), "--weights-offload-cpu-gib", "1"]
    assert main([*PLAN, *args, "--weights-offload-params", pattern]) == 2
    out = capsys.readouterr().out
    [refusal] = [line for line in out.splitlines() if line.startswith("cannot start:")]
    assert f"weights_offload.params: {pattern!r} matches no parameter vLLM offloads" in refusal
    for component in (
        "'visual' (vision tower, 1.18 GiB)",
        "'visual.merger' (projector, 0.08 GiB)",
        "'language_model' (language model, 14.18 GiB)",
    ):
        assert component in refusal


def test_the_plan_shows_the_components(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--model", str(QWEN25_VL_7B)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["visual", "1.18", "GiB", "(vision", "tower)"] in rows
    assert ["visual.merger", "0.08", "GiB", "(projector)"] in rows
    assert ["language_model", "14.18", "GiB", "(language", "model)"] in rows


def test_what_the_offloader_cannot_take_is_refused() -> None:
    facts = model_facts.read(QWEN25_VL_7B)
    host = make_host(24, ram_gib=64)
    prefetch = config_for(
        **{"weights_offload.params": ["visual"], "weights_offload.backend": "prefetch"}
    )
    problems = make_plan(prefetch, facts, host, "cuda").notes.problems
    assert [p["field"] for p in problems] == ["weights_offload.params"]
    assert "the prefetch backend never offloads" in problems[0]["message"]
    too_much = config_for(**{"weights_offload.params": ["visual"], "weights_offload.cpu_gib": 4.0})
    [problem] = make_plan(too_much, facts, host, "cuda").notes.problems
    assert problem["field"] == "weights_offload.cpu_gib"
    assert "takes at most 1.26 GiB" in problem["message"]


def test_an_oversized_safetensors_header_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(QWEN25_VL_7B / "config.json", tmp_path / "config.json")
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes((100 * 1024 * 1024 + 1).to_bytes(8, "little") + b"{}")
    with pytest.raises(
        ModelFactsError, match=r"model-00002-of-00002\.safetensors: safetensors header too large"
    ):
        model_facts.read(tmp_path)
    assert main([*PLAN, "--model", str(tmp_path)]) == 2
    assert "model-00002-of-00002.safetensors" in capsys.readouterr().err


def test_a_tensor_without_shape_is_refused_naming_the_file(tmp_path: Path) -> None:
    shutil.copy(QWEN25_VL_7B / "config.json", tmp_path / "config.json")
    header = tiny_qwen25_vl_headers(True)["model.safetensors"]
    header["model.visual.merger.mlp.0.weight"] = {"dtype": "BF16"}
    write_header(tmp_path / "model-00001-of-00002.safetensors", header)
    with pytest.raises(
        ModelFactsError,
        match=r"model-00001-of-00002.safetensors: tensor "
        r"'model.visual.merger.mlp.0.weight' has no valid shape",
    ):
        model_facts.read(tmp_path)


def test_without_patterns_the_towers_go_first_and_the_plan_says_so() -> None:
    """vLLM builds (and offloads) Qwen2.5-VL's vision tower before its language model."""
    config = config_for(**{"weights_offload.cpu_gib": 4.0})
    plan = make_plan(config, model_facts.read(QWEN25_VL_7B), make_host(24, ram_gib=64), "cuda")
    [note] = [d for d in plan.notes.decisions if "towers first" in d]
    assert "1.26 GiB of the 4.00 GiB are theirs" in note
    # the towers have MLPs too: 'mlp' is not a way to keep them on the GPU
    assert note.endswith("('input_layernorm', 'post_attention_layernorm', 'self_attn')")


def test_prefetch_layers_leave_the_towers_out() -> None:
    """One decoder layer of Qwen2.5-VL-7B's language model: 233 M parameters in bf16 (the
    towers' 0.68 B are not shared among the layers)."""
    facts = model_facts.read(QWEN25_VL_7B)
    h, inter = 3584, 18944
    layer = h * (h + 512 + 512) + h * h + 3 * h * inter
    assert decoder_layer_bytes(facts, facts.weight_bytes, 2) == pytest.approx(2 * layer, rel=0.01)


def test_a_checkpoint_whose_layers_are_not_recognised_refuses_no_pattern(tmp_path: Path) -> None:
    """Decoder layers under a name the planner does not know: nothing to check a pattern
    against, so none is refused (a false refusal would block a working config)."""
    shutil.copy(QWEN25_VL_7B / "config.json", tmp_path / "config.json")
    write_header(
        tmp_path / "model.safetensors",
        {"model.decoder.stack.0.proj.weight": tensor([32, 32]), "visual.x.weight": tensor([4])},
    )
    facts = model_facts.read(tmp_path)
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(tmp_path), "weights_offload.params": ["proj"]}
    )
    plan = make_plan(config, facts, make_host(24, ram_gib=64), "cuda")
    assert plan.notes.problems == ()


def test_the_random_vlm_checkpoint_has_the_components_the_plan_counts() -> None:
    """benchmarks/gpu/kit/checkpoint.py's Qwen2.5-VL-7B tensors (the GPU measurement's
    checkpoint, issue #46), read as a checkpoint's headers are: the same components, the
    towers with the bytes config.json alone gives them (the language model's estimate
    leaves out its norms and q/k/v biases: 0.3 M of 7.6 B), and 'visual' takes every tower
    tensor."""
    from benchmarks.gpu.kit import checkpoint as script
    from vllm_offload.model.parts import from_tensors, matching

    config = json.loads((QWEN25_VL_7B / "config.json").read_text())
    shapes = script.shapes(config)
    sizes = {name: 2.0 * math.prod(shape) for name, shape in shapes.items()}
    from_files = {p.name: p for p in from_tensors("qwen2_5_vl", sizes)}
    from_config = {p.name: p.bytes for p in model_facts.read(QWEN25_VL_7B).components}
    assert list(from_files) == list(from_config)
    for name in ("visual", "visual.merger"):
        assert from_files[name].bytes == from_config[name]
    language = from_files["language_model"].bytes
    assert language == pytest.approx(from_config["language_model"], rel=1e-4)
    tower = [p.name for p in matching("visual", from_files.values())]
    assert tower == ["visual", "visual.merger"]
    visual = sum(size for name, size in sizes.items() if name.startswith("visual."))
    assert visual == sum(from_files[name].bytes for name in tower)
