"""config.json read as values in the ranges real models keep: the decoder's part of a
multimodal config, each layer's KV kind, the parameter shape. A model folder is untrusted
input: a number outside its range is refused, naming the key (ModelFactsError).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from vllm_offload.errors import VllmOffloadError
from vllm_offload.model import weight_estimate

LayerKindName = Literal["full", "sliding", "mla", "linear"]

# Ranges past every released model (layers: Llama 3.1 405B has 126) that keep the
# planner's arithmetic and loops small.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 20  # hidden size, intermediate sizes, head counts and sizes, ranks
MAX_TOKENS = 1 << 28  # context lengths and sliding windows
MAX_VOCAB = 1 << 24


class ModelFactsError(VllmOffloadError):
    """The directory is not a model the planner can read; the text says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="model.path")


@dataclass(frozen=True, kw_only=True)
class LayerKind:
    """How one decoder layer stores KV per token."""

    kind: LayerKindName
    window: int | None = None  # sliding: tokens kept
    kv_lora_rank: int = 0  # mla
    rope_dim: int = 0  # mla


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
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


def whole_number(cfg: dict[str, Any], key: str, high: int = MAX_WIDTH, low: int = 1) -> int:
    """``cfg[key]``: a whole number from ``low`` to ``high``; else ModelFactsError."""
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ModelFactsError(
            f"config.json: '{key}' is missing or not a whole number from {low:,} to {high:,}"
        )
    return value


def optional_number(cfg: dict[str, Any], key: str, default: int, high: int = MAX_WIDTH) -> int:
    """``cfg[key]`` as ``whole_number``, or ``default`` where it is absent, null or 0 (configs
    write 0 for "not set")."""
    if cfg.get(key) in (None, 0):
        return default
    return whole_number(cfg, key, high)


def short_text(cfg: dict[str, Any], key: str, default: str) -> str:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or len(value) > 256:
        raise ModelFactsError(f"config.json: '{key}' is not a short string")
    return value


def layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[tuple[LayerKind, ...], list[str]]:
    unknown: list[str] = []
    if cfg.get("kv_lora_rank"):
        mla = LayerKind(
            kind="mla",
            kv_lora_rank=whole_number(cfg, "kv_lora_rank"),
            rope_dim=whole_number(cfg, "qk_rope_head_dim", low=0),
        )
        return (mla,) * num_layers, unknown
    window = None if cfg.get("use_sliding_window") is False else cfg.get("sliding_window")
    if window is not None:
        window = optional_number(cfg, "sliding_window", 0, MAX_TOKENS) or None
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == num_layers:
        kinds: list[LayerKind] = []
        for name in layer_types:
            if name == "full_attention":
                kinds.append(LayerKind(kind="full"))
            elif name in ("sliding_attention", "chunked_attention") and window is not None:
                kinds.append(LayerKind(kind="sliding", window=window))
            elif name in ("linear_attention", "mamba", "mamba2", "conv", "gated_delta_net"):
                kinds.append(LayerKind(kind="linear"))
            else:
                unknown.append(f"layer type {str(name)[:40]!r} (planned as full attention)")
                kinds.append(LayerKind(kind="full"))
        return tuple(kinds), unknown
    pattern = optional_number(cfg, "sliding_window_pattern", 0, MAX_LAYERS)
    if window is not None and pattern > 1:
        # Gemma-2/3 style: every pattern-th layer is global, the rest slide.
        return tuple(
            LayerKind(kind="full")
            if (i + 1) % pattern == 0
            else LayerKind(kind="sliding", window=window)
            for i in range(num_layers)
        ), unknown
    if window is not None:
        return (LayerKind(kind="sliding", window=window),) * num_layers, unknown
    return (LayerKind(kind="full"),) * num_layers, unknown


def routed_experts(cfg: dict[str, Any]) -> int:
    """Routed experts a layer, under the names Qwen-MoE, DeepSeek and Mixtral give them;
    0 for a dense model."""
    keys = ("num_experts", "n_routed_experts", "num_local_experts")
    return next((n for n in (optional_number(cfg, key, 0) for key in keys) if n), 0)


def experts_per_token(cfg: dict[str, Any]) -> int:
    """Routed experts each token goes through, under the names Qwen-MoE, DeepSeek,
    Mixtral and gpt-oss give them; 0 where none is named."""
    keys = ("num_experts_per_tok", "experts_per_token", "moe_topk")
    return next((n for n in (optional_number(cfg, key, 0) for key in keys) if n), 0)


def parameter_shape(
    cfg: dict[str, Any], *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int
) -> weight_estimate.Shape:
    """The parameter counts of config.json, each checked against its range."""
    inter = optional_number(cfg, "intermediate_size", 4 * hidden)
    return weight_estimate.Shape(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=optional_number(cfg, "vocab_size", 32000, MAX_VOCAB),
        intermediate=inter,
        experts=routed_experts(cfg),
        moe_intermediate=optional_number(cfg, "moe_intermediate_size", inter),
        tied_embeddings=bool(cfg.get("tie_word_embeddings")),
    )
