"""Issue #38: quantized checkpoints' weight bytes, from config.json alone and from the
safetensors headers, against the published sizes of real checkpoints. The configs are the
published ones' shapes and quantization_config (written here: no hub in tests)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from tests.shapes import QWEN3_30B_A3B, write_shape
from vllm_offload.cli import main
from vllm_offload.model import facts as model_facts

LLAMA2_7B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "vocab_size": 32000,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
}
LLAMA2_13B = dict(
    LLAMA2_7B,
    hidden_size=5120,
    intermediate_size=13824,
    num_hidden_layers=40,
    num_attention_heads=40,
    num_key_value_heads=40,
)
LLAMA31_8B: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "benchmarks/models/llama-3.1-8b/config.json").read_text()
)
AWQ = {
    "quant_method": "awq",
    "bits": 4,
    "group_size": 128,
    "version": "gemm",
    "zero_point": True,
    "modules_to_not_convert": None,
}
GPTQ = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": 128,
    "desc_act": False,
    "sym": True,
    "true_sequential": True,
    "damp_percent": 0.01,
}
COMPRESSED_FP8 = {  # neuralmagic's FP8 checkpoints (llm-compressor)
    "quant_method": "compressed-tensors",
    "format": "float-quantized",
    "quantization_status": "compressed",
    "ignore": ["lm_head"],
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 8,
                "type": "float",
                "strategy": "channel",
                "symmetric": True,
                "dynamic": False,
                "group_size": None,
            },
            "input_activations": {
                "num_bits": 8,
                "type": "float",
                "strategy": "token",
                "dynamic": True,
            },
        }
    },
}
BNB_4BIT = {
    "quant_method": "bitsandbytes",
    "load_in_4bit": True,
    "load_in_8bit": False,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "bfloat16",
    "llm_int8_skip_modules": None,
}

GB = 1e9

# (config, published size of the checkpoint's safetensors in GB)
PUBLISHED = {
    "TheBloke/Llama-2-7B-AWQ": (dict(LLAMA2_7B, quantization_config=AWQ), 3.89),
    "TheBloke/Llama-2-13B-AWQ": (dict(LLAMA2_13B, quantization_config=AWQ), 7.25),
    "TheBloke/Llama-2-7B-GPTQ": (dict(LLAMA2_7B, quantization_config=GPTQ), 3.90),
    "neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8": (
        dict(LLAMA31_8B, quantization_config=COMPRESSED_FP8),
        9.08,
    ),
    "unsloth/llama-3-8b-bnb-4bit": (dict(LLAMA31_8B, quantization_config=BNB_4BIT), 5.70),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_config_json_alone_gives_the_published_size(tmp_path: Path, name: str) -> None:
    config, published_gb = PUBLISHED[name]
    facts = model_facts.read(write_shape(tmp_path, config))
    assert facts.weight_bytes_source == "parameter count"
    assert facts.weight_bytes / GB == pytest.approx(published_gb, rel=0.03)
    assert facts.unknown == ()


def test_qwen3_moe_awq_is_read_at_4_bits(tmp_path: Path) -> None:
    """The issue's checkpoint: Qwen3-30B-A3B AWQ 4-bit, 128 experts, ~17 GB (it was counted
    in 16 bits: 56.87 GiB)."""
    config = dict(QWEN3_30B_A3B, torch_dtype="float16", quantization_config=AWQ)
    facts = model_facts.read(write_shape(tmp_path, config))
    assert 16.5 * GB <= facts.weight_bytes <= 18 * GB


def test_fp8_block_quantized_moe(tmp_path: Path) -> None:
    """Qwen's own FP8 releases: quant_method fp8, 128x128 blocks; embeddings and the LM head
    stay in bfloat16 (30.5 B parameters: ~29.9 B in linear layers)."""
    fp8 = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    facts = model_facts.read(write_shape(tmp_path, dict(QWEN3_30B_A3B, quantization_config=fp8)))
    assert facts.weight_bytes / GB == pytest.approx(29.9 + 1.25, rel=0.02)


def test_modules_left_unquantized_count_at_16_bits(tmp_path: Path) -> None:
    keep_attention = dict(AWQ, modules_to_not_convert=["model.layers.*.self_attn"])
    whole = model_facts.read(write_shape(tmp_path / "a", dict(LLAMA2_7B, quantization_config=AWQ)))
    kept = model_facts.read(
        write_shape(tmp_path / "b", dict(LLAMA2_7B, quantization_config=keep_attention))
    )
    attention = 32 * 4 * 4096 * 4096
    assert kept.weight_bytes - whole.weight_bytes == pytest.approx(attention * 1.48, rel=0.01)


def test_an_unknown_quantization_is_said(tmp_path: Path) -> None:
    odd = dict(LLAMA2_7B, quantization_config={"quant_method": "qfoo", "bits": 3})
    facts = model_facts.read(write_shape(tmp_path, odd))
    assert facts.unknown == ("quantization 'qfoo' (weights planned at 16 bits)",)


def write_header(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A safetensors file's header (the data past it is never read)."""
    header = {
        name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]}
        for name, (dtype, shape) in tensors.items()
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_safetensors_headers_of_packed_tensors(tmp_path: Path) -> None:
    """Packed 4-bit weights (I32, U8), their scales and zeros, and MXFP4's E8M0 scales."""
    write_shape(tmp_path, dict(LLAMA2_7B, quantization_config=AWQ))
    k, n, g = 4096, 4096, 128
    write_header(
        tmp_path / "model.safetensors",
        {
            "q.qweight": ("I32", [k, n // 8]),
            "q.qzeros": ("I32", [k // g, n // 8]),
            "q.scales": ("F16", [k // g, n]),
            "bnb.weight": ("U8", [k * n // 2, 1]),
            "mx.blocks": ("U8", [n, k // 32, 16]),
            "mx.scales": ("F8_E8M0", [n, k // 32]),
        },
    )
    facts = model_facts.read(tmp_path)
    assert facts.weight_bytes_source == "safetensors"
    awq = k * n // 2 + k // g * n // 2 + k // g * n * 2
    assert facts.weight_bytes == awq + k * n // 2 + k * n // 2 + n * k // 32


def test_plan_of_the_issue_reads_17_gb_of_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's plan counted 56.87 GiB of weights; read at 4 bits they leave the card
    room for the model's whole context (52000 tokens are past its 40,960: refused, as vLLM
    refuses them)."""
    config = dict(QWEN3_30B_A3B, torch_dtype="float16", quantization_config=AWQ)
    model = write_shape(tmp_path / "qwen3-awq", config)
    declared = ["plan", "--model", str(model), "--gpu-mem-gib", "24", "--ram-gib", "128"]
    assert main([*declared, "--model-max-model-len", "52000"]) == 2
    assert "past the model's limit of 40,960" in capsys.readouterr().out
    assert main([*declared, "--model-max-model-len", "40960", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert 16.5 * GB <= plan["weight_bytes"] <= 18 * GB
    assert plan["weights_offloaded_bytes"] == 0


def test_the_lm_head_is_quantized_only_where_the_checkpoint_says(tmp_path: Path) -> None:
    head = 32000 * 4096  # Llama-2-7B's untied LM head
    plain = model_facts.read(write_shape(tmp_path / "a", dict(LLAMA2_7B, quantization_config=GPTQ)))
    with_head = model_facts.read(
        write_shape(tmp_path / "b", dict(LLAMA2_7B, quantization_config=dict(GPTQ, lm_head=True)))
    )
    assert plain.weight_bytes - with_head.weight_bytes == pytest.approx(head * 1.48, rel=0.01)
    unignored = dict(COMPRESSED_FP8, ignore=[])
    fp8_head = model_facts.read(
        write_shape(tmp_path / "c", dict(LLAMA31_8B, quantization_config=unignored))
    )
    fp8 = model_facts.read(
        write_shape(tmp_path / "d", dict(LLAMA31_8B, quantization_config=COMPRESSED_FP8))
    )
    assert fp8.weight_bytes - fp8_head.weight_bytes == pytest.approx(128256 * 4096, rel=1e-3)
