"""A tiny random-weight Llama with a locally built tokenizer and a chat template.

Tests that need speed or a shape serve it (`vllm-offload demo-model --random DIR`); the
default model is the real one (real_model.py). Its answers are gibberish; its shapes,
files and tokenizer are those of a real Llama checkpoint.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "is",
    "are",
    "was",
    "be",
    "on",
    "for",
    "with",
    "as",
    "by",
    "at",
    "from",
    "this",
    "that",
    "it",
    "we",
    "you",
    "they",
    "he",
    "she",
    "model",
    "server",
    "memory",
    "cache",
    "token",
    "tokens",
    "request",
    "requests",
    "block",
    "blocks",
    "gpu",
    "cpu",
    "offload",
    "tier",
    "host",
    "ram",
    "weights",
    "layer",
    "layers",
    "attention",
    "key",
    "value",
    "prefix",
    "reuse",
    "long",
    "short",
    "fast",
    "slow",
    "start",
    "stop",
    "serve",
    "answer",
    "question",
    "hello",
    "world",
    "yes",
    "no",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "chat",
    "user",
    "assistant",
    "system",
    "time",
    "data",
    "page",
    "text",
]

HIDDEN = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 4
INTERMEDIATE = 512
VOCAB = 1024
MAX_POSITIONS = 8192


def _corpus(rng: np.random.Generator, lines: int = 2000) -> list[str]:
    return [" ".join(rng.choice(_WORDS, size=int(rng.integers(4, 16)))) for _ in range(lines)]


def build_tokenizer(rng: np.random.Generator) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(rng), trainer)
    return tokenizer


def _bf16_bytes(array: np.ndarray) -> bytes:
    # bfloat16 is the top half of float32 (truncation is fine for random weights).
    as_u32 = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    return (as_u32 >> 16).astype("<u2").tobytes()


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = 0
    for name, array in tensors.items():
        blob = _bf16_bytes(array)
        header[name] = {
            "dtype": "BF16",
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    head_dim = HIDDEN // HEADS

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.02, size=shape).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "post_attention_layernorm.weight": np.ones(HIDDEN, np.float32),
            p + "self_attn.q_proj.weight": normal(HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": normal(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": normal(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": normal(INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": normal(HIDDEN, INTERMEDIATE),
        }
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    tensors["lm_head.weight"] = normal(VOCAB, HIDDEN)
    return tensors


def config_json() -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def write(model_dir: Path, seed: int = 0) -> Path:
    """Write the demo model into ``model_dir`` (created; files replaced). Returns it.

    Files go into a sibling temp directory first and are renamed into place, so a
    reader never sees half a model.
    """
    model_dir = model_dir.absolute()
    rng = np.random.default_rng(seed)
    staging = model_dir.with_name(f".{model_dir.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(rng)
    tokenizer.save(str(staging / "tokenizer.json"))
    (staging / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": SPECIAL_TOKENS[0],
                "eos_token": SPECIAL_TOKENS[1],
                "pad_token": SPECIAL_TOKENS[1],
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": MAX_POSITIONS,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    (staging / "config.json").write_text(json.dumps(config_json(), indent=2))
    (staging / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 1}, indent=2)
    )
    write_safetensors(staging / "model.safetensors", _weights(rng))
    model_dir.mkdir(parents=True, exist_ok=True)
    for item in staging.iterdir():
        os.replace(item, model_dir / item.name)
    staging.rmdir()
    return model_dir
