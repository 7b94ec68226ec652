"""config.json files of well-known model shapes, written locally (no hub)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The shape the GPU benchmarks serve with dummy weights; one file for both.
LLAMA3_8B: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "benchmarks/models/llama-3-8b/config.json").read_text()
)
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 40960,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
}
# Llama-3.1-70B's shape (131 GiB in bf16: no one GPU holds it)
LLAMA_70B: dict[str, Any] = dict(
    LLAMA3_8B,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
)
# Qwen2.5-7B(-Instruct, -Coder): the two-model example's second model
QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "vocab_size": 152064,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
GEMMA3_4B_TEXT: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_hidden_layers": 34,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "sliding_window": 1024,
    "layer_types": [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)
    ],
    "max_position_embeddings": 131072,
    "vocab_size": 262208,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 256,
    "hidden_activation": "gelu_pytorch_tanh",
}
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 163840,
    "vocab_size": 102400,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "greedy",
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "tie_word_embeddings": False,
}

SHAPES = {
    "llama3-8b": LLAMA3_8B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "gemma3-4b": GEMMA3_4B_TEXT,
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
}


def write_shape(directory: Path, config: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory
