from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shapes import DEEPSEEK_V2_LITE, GEMMA3_4B_TEXT, LLAMA3_8B, QWEN3_30B_A3B, write_shape
from vllm_offload import model_facts
from vllm_offload.model_facts import ModelFactsError


def test_llama(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, LLAMA3_8B))
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim) == (32, 8, 128)
    assert {layer.kind for layer in facts.layers} == {"full"}
    assert facts.weight_bytes_source == "parameter count"
    assert facts.weight_bytes == pytest.approx(16.06e9, rel=0.01)  # 8.03 B params in bf16


def test_gemma3_sliding_pattern(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, GEMMA3_4B_TEXT))
    kinds = [layer.kind for layer in facts.layers]
    assert kinds.count("full") == 5 and kinds.count("sliding") == 29
    assert facts.layers[0].window == 1024


def test_gemma3_nested_text_config(tmp_path: Path) -> None:
    outer = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": GEMMA3_4B_TEXT,
    }
    facts = model_facts.read(write_shape(tmp_path, outer))
    assert facts.architecture == "Gemma3ForConditionalGeneration"
    assert facts.num_layers == 34


def test_mla(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, DEEPSEEK_V2_LITE))
    assert facts.layers[0].kind == "mla"
    assert (facts.layers[0].kv_lora_rank, facts.layers[0].rope_dim) == (512, 64)


def test_moe_weights_estimate(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, QWEN3_30B_A3B))
    assert facts.weight_bytes == pytest.approx(61.0e9, rel=0.02)  # 30.5 B params in bf16


def test_linear_layers_have_no_per_token_kv(tmp_path: Path) -> None:
    hybrid = dict(LLAMA3_8B, num_hidden_layers=4,
                  layer_types=["linear_attention", "linear_attention", "linear_attention",
                               "full_attention"])  # fmt: skip
    facts = model_facts.read(write_shape(tmp_path, hybrid))
    assert [layer.kind for layer in facts.layers] == ["linear"] * 3 + ["full"]


def test_unknown_layer_type_is_reported(tmp_path: Path) -> None:
    odd = dict(LLAMA3_8B, num_hidden_layers=2, layer_types=["full_attention", "hyper"])
    facts = model_facts.read(write_shape(tmp_path, odd))
    assert facts.unknown == ("layer type 'hyper' (planned as full attention)",)


def test_quantization(tmp_path: Path) -> None:
    quant = dict(LLAMA3_8B, quantization_config={"quant_method": "awq", "bits": 4})
    assert model_facts.read(write_shape(tmp_path, quant)).quantization == "awq"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"hidden_size": 8}), "'num_hidden_layers' is missing"),
        (json.dumps(dict(LLAMA3_8B, num_attention_heads="many")), "'num_attention_heads'"),
    ],
)
def test_garbled_config(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelFactsError, match=message):
        model_facts.read(tmp_path)


def test_garbled_safetensors_header(tmp_path: Path) -> None:
    write_shape(tmp_path, LLAMA3_8B)
    (tmp_path / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{garbage" * 3)
    with pytest.raises(ModelFactsError, match="garbled safetensors header"):
        model_facts.read(tmp_path)
