"""The longest max_model_len vLLM accepts for a model without VLLM_ALLOW_LONG_MAX_MODEL_LEN,
derived from config.json as vLLM 0.32 derives it for a generating model (config/model.py
_get_and_verify_max_len; its keys in model_arch_config_convertor.py): the smallest of the
length keys, a Command-R ``model_max_length`` over them, times the RoPE scaling factor for
the rope types that do not already scale ``max_position_embeddings`` (the tokenizer's
``model_max_length`` counts only for pooling models). tests/model/test_limit.py
checks it against vLLM's own ModelConfig."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# Rope types whose max_position_embeddings already holds the scaled length.
PRESCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return float(value)


def _rope_parameters(cfg: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One dict per layer type where they are nested (Transformers' rope_parameters), else
    the one ``rope_parameters`` or the older ``rope_scaling``."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling")
    if not isinstance(rope, dict):
        return
    nested = [v for v in rope.values() if isinstance(v, dict)]
    if nested and all(isinstance(v, dict) for v in rope.values()):
        yield from (v for v in nested if v)
    elif rope:
        yield rope


def rope_factor(cfg: dict[str, Any]) -> float:
    """The factor vLLM multiplies the length keys' limit by (1: none)."""
    if "gemma3" in str(cfg.get("model_type", "")):
        return 1.0  # Gemma 3's limit is already scaled (vLLM's note)
    factor = 1.0
    for rope in _rope_parameters(cfg):
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind not in PRESCALED_ROPE:
            factor = _number(rope.get("factor")) or factor
    return factor


def max_len_limit(cfg: dict[str, Any]) -> tuple[int, str]:
    """(the limit in tokens, the key it comes from); (0, '') where config.json names none
    (vLLM then takes a configured length as it is)."""
    found = [(n, key) for key in LENGTH_KEYS if (n := _number(cfg.get(key))) is not None]
    if not found:
        return 0, ""
    limit, key = min(found, key=lambda item: item[0])  # the first smallest, as vLLM
    if (command_r := _number(cfg.get("model_max_length"))) is not None:
        limit, key = command_r, "model_max_length"
    factor = rope_factor(cfg)
    if factor != 1.0:
        key += f" x rope factor {factor:g}"
    return int(limit * factor), key
