"""What the planner needs to know about a model, read from its local HF directory.

Only ``config.json`` and the safetensors *headers* are read; no weights, no
vLLM import. The record is immutable and small.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vllm_offload.errors import VllmOffloadError

LayerKindName = Literal["full", "sliding", "mla", "linear"]

DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}

# safetensors dtype tags -> bytes per element
_SAFETENSORS_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 0.5,
}

_MAX_HEADER_BYTES = 100 * 1024 * 1024


class ModelFactsError(VllmOffloadError):
    """The directory is not a model the planner can read; the text says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="model.path")


@dataclass(frozen=True)
class LayerKind:
    """How one decoder layer stores KV per token."""

    kind: LayerKindName
    window: int | None = None  # sliding: tokens kept
    kv_lora_rank: int = 0  # mla
    rope_dim: int = 0  # mla


@dataclass(frozen=True)
class ModelFacts:
    path: str
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    torch_dtype: str
    quantization: str | None
    layers: tuple[LayerKind, ...]
    weight_bytes: int
    weight_bytes_source: Literal["safetensors", "parameter count"]
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    unknown: tuple[str, ...] = ()  # what could not be read, in words
    # config.json's bytes and every weight file's name, size and mtime, hashed: the disk
    # tier keeps a model's KV under it, so changed weights at the same path find none.
    fingerprint: str = ""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.torch_dtype, 2)


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    # Multimodal configs (Gemma 3, Llava, Qwen-VL) keep the decoder under text_config.
    text = cfg.get("text_config")
    if isinstance(text, dict):
        merged = dict(text)
        # The outer config names what vLLM loads; dtype and quantisation may sit either side.
        if "architectures" in cfg:
            merged["architectures"] = cfg["architectures"]
        for key in ("torch_dtype", "dtype", "quantization_config"):
            if key in cfg and key not in merged:
                merged[key] = cfg[key]
        return merged
    return cfg


def _int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelFactsError(f"config.json: '{key}' is missing or not a whole number")
    return int(value)


def _layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[tuple[LayerKind, ...], list[str]]:
    unknown: list[str] = []
    if "kv_lora_rank" in cfg and cfg.get("kv_lora_rank"):
        mla = LayerKind(
            "mla",
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            rope_dim=_int(cfg, "qk_rope_head_dim"),
        )
        return (mla,) * num_layers, unknown
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        kinds: list[LayerKind] = []
        for name in layer_types:
            if name == "full_attention":
                kinds.append(LayerKind("full"))
            elif name in ("sliding_attention", "chunked_attention") and isinstance(window, int):
                kinds.append(LayerKind("sliding", window=window))
            elif name in ("linear_attention", "mamba", "mamba2", "conv", "gated_delta_net"):
                kinds.append(LayerKind("linear"))
            else:
                unknown.append(f"layer type '{name}' (planned as full attention)")
                kinds.append(LayerKind("full"))
        return tuple(kinds), unknown
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(window, int) and isinstance(pattern, int) and pattern > 1:
        # Gemma-2/3 style: every pattern-th layer is global, the rest slide.
        return tuple(
            LayerKind("full") if (i + 1) % pattern == 0 else LayerKind("sliding", window=window)
            for i in range(num_layers)
        ), unknown
    if isinstance(window, int) and window > 0:
        return (LayerKind("sliding", window=window),) * num_layers, unknown
    return (LayerKind("full"),) * num_layers, unknown


def read_safetensors_bytes(model_dir: Path) -> int | None:
    """Sum of tensor sizes from the safetensors headers; None when there are none."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0.0
    for file in files:
        with file.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ModelFactsError(f"{file.name}: truncated safetensors file")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > _MAX_HEADER_BYTES:
                raise ModelFactsError(f"{file.name}: safetensors header too large")
            try:
                header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise ModelFactsError(f"{file.name}: garbled safetensors header") from None
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in entry["shape"]:
                count *= dim
            total += count * _SAFETENSORS_BYTES.get(entry["dtype"], 2)
    return int(total)


def _estimate_weight_bytes(cfg: dict[str, Any], dtype_bytes: int) -> int:
    hidden = cfg["hidden_size"]
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    vocab = cfg.get("vocab_size", 32000)
    inter = cfg.get("intermediate_size", 4 * hidden)
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    experts = cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    if experts:
        moe_inter = cfg.get("moe_intermediate_size", inter)
        mlp = experts * 3 * hidden * moe_inter + hidden * experts
    else:
        mlp = 3 * hidden * inter
    embeddings = vocab * hidden * (1 if cfg.get("tie_word_embeddings") else 2)
    return int((layers * (attn + mlp) + embeddings) * dtype_bytes)


WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def fingerprint(model_dir: Path) -> str:
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    files = sorted({f for pattern in WEIGHT_FILE_PATTERNS for f in model_dir.glob(pattern)})
    for weights in files:
        stat = weights.stat()
        digest.update(f"{weights.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def read(model_dir: Path) -> ModelFacts:
    """Read a local HF model directory; raise ModelFactsError saying what is wrong."""
    if not model_dir.is_dir():
        raise ModelFactsError(f"{model_dir}: no such directory")
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelFactsError(
            f"{model_dir}: not a Hugging Face model directory (no config.json); "
            "point model.path at the folder holding config.json and the weights"
        )
    try:
        raw = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFactsError(f"{config_path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ModelFactsError(f"{config_path}: expected a JSON object")
    cfg = _text_config(raw)
    archs = cfg.get("architectures") or ["unknown"]
    num_layers = _int(cfg, "num_hidden_layers")
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    if heads == 0:
        raise ModelFactsError("config.json: 'num_attention_heads' must be positive")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    quant = cfg.get("quantization_config")
    layers, unknown = _layer_kinds(cfg, num_layers)
    weight_bytes = read_safetensors_bytes(model_dir)
    source: Literal["safetensors", "parameter count"] = "safetensors"
    if weight_bytes is None:
        weight_bytes = _estimate_weight_bytes(cfg, DTYPE_BYTES.get(dtype, 2))
        source = "parameter count"
    return ModelFacts(
        path=str(model_dir),
        architecture=str(archs[0]),
        model_type=str(cfg.get("model_type", "unknown")),
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 0),
        torch_dtype=dtype,
        quantization=str(quant.get("quant_method")) if isinstance(quant, dict) else None,
        layers=layers,
        weight_bytes=weight_bytes,
        weight_bytes_source=source,
        vocab_size=int(cfg.get("vocab_size") or 0),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))),
        unknown=tuple(unknown),
        fingerprint=fingerprint(model_dir),
    )
