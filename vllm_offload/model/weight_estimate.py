"""A checkpoint's weight bytes from config.json alone: each group of modules' parameter count
at the bytes its quantization stores (when there are no safetensors headers to sum).

Quantized linear layers store ``bits`` per weight plus, per group of ``group_size`` input
weights, a 16-bit scale (and a packed zero point where the scheme is asymmetric); modules a
checkpoint leaves unquantized (``modules_to_not_convert``, compressed-tensors' ``ignore``,
``llm_int8_skip_modules``, ``ignored_layers``), and embeddings always, stay at the model's
dtype. Checked against published sizes (tests/model/test_weight_estimate.py).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Any

# bitsandbytes: 4-bit blocks of 64 weights, each with an absmax (a byte under double
# quantization, whose own fp32 constants cover 256 blocks; else fp32); 8-bit: a scale a row.
BNB_4BIT_BLOCK = 64
BNB_NESTED_BLOCKS = 256
# MXFP4: 32 weights share one 8-bit (E8M0) scale; NVFP4: 16 share an fp8 scale.
MX_BLOCK, NVFP4_BLOCK = 32, 16
SCALE_BYTES = 2  # 16-bit scales (AWQ, GPTQ, compressed-tensors)
PER_CHANNEL = 1 << 16  # a group as wide as a row: its scales are too few to count
SKIP_KEYS = ("modules_to_not_convert", "ignore", "llm_int8_skip_modules", "ignored_layers")


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The parameter counts config.json gives, already checked against their ranges."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    experts: int  # routed experts a layer; 0: a dense MLP
    moe_intermediate: int
    tied_embeddings: bool


@dataclass(frozen=True, kw_only=True)
class Scheme:
    """How a checkpoint stores its quantized linear layers."""

    bytes_per_weight: float
    skipped: tuple[str, ...]  # module name patterns left at the model's dtype


def module_groups(shape: Shape) -> dict[str, int]:
    """Parameters by module, named as in the checkpoint (layer 0 stands for every layer)."""
    h = shape.hidden
    attention = h * shape.heads * shape.head_dim * 2 + h * shape.kv_heads * shape.head_dim * 2
    groups = {"model.layers.0.self_attn.q_proj": shape.layers * attention}
    if shape.experts:
        experts = shape.experts * 3 * h * shape.moe_intermediate
        groups["model.layers.0.mlp.experts.0.gate_proj"] = shape.layers * experts
        groups["model.layers.0.mlp.gate"] = shape.layers * h * shape.experts  # the router
    else:
        groups["model.layers.0.mlp.gate_proj"] = shape.layers * 3 * h * shape.intermediate
    groups["model.embed_tokens"] = shape.vocab * h
    if not shape.tied_embeddings:
        groups["lm_head"] = shape.vocab * h
    return groups


def _matches(pattern: str, module: str) -> bool:
    """vLLM's readings of a skip list: compressed-tensors' ``re:`` regexes, class names
    (``Linear`` is a target, not a skip), or dotted names matched whole part by part
    (``*`` for any part): 'gate' is the router, not 'gate_proj'."""
    if pattern.startswith("re:"):
        return re.search(pattern[3:], module) is not None
    parts, names = pattern.split("."), module.split(".")
    return any(
        all(fnmatch.fnmatchcase(name, part) for name, part in zip(names[i:], parts, strict=False))
        for i in range(len(names) - len(parts) + 1)
    )


def _int(quant: dict[str, Any], *keys: str, default: int) -> int:
    for key in keys:
        value = quant.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 64:
            return value
        if isinstance(value, int) and value == -1:  # per channel: one scale a row
            return PER_CHANNEL
    return default


def _group_bytes(bits: int, group: int, zero_point: bool) -> float:
    """Bytes a weight of a linear layer quantized to ``bits`` in groups of ``group``."""
    per_group = SCALE_BYTES + (bits / 8 if zero_point else 0)
    return bits / 8 + per_group / group


def _compressed_tensors(quant: dict[str, Any]) -> float | None:
    """compressed-tensors: its first config group's weights (the scheme a checkpoint made
    by llm-compressor applies to its Linear layers)."""
    groups = quant.get("config_groups")
    first = next(iter(groups.values()), None) if isinstance(groups, dict) else None
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        return None
    bits = _int(weights, "num_bits", default=8)
    grouped = weights.get("strategy") == "group"
    group = _int(weights, "group_size", default=PER_CHANNEL) if grouped else PER_CHANNEL
    return _group_bytes(bits, group, zero_point=weights.get("symmetric") is False)


def bytes_per_weight(quant: dict[str, Any]) -> float | None:
    """Bytes one weight of a quantized linear layer takes; None for a method not known here."""
    method = str(quant.get("quant_method", "")).lower()
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        bits = _int(quant, "bits", "w_bit", default=4)
        group = _int(quant, "group_size", "q_group_size", default=128)
        return _group_bytes(bits, group, zero_point=True)  # both store packed zeros
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    if method in ("fp8", "fbgemm_fp8"):
        return 1.0  # block or channel scales: under 0.1 %
    if method == "bitsandbytes":
        if quant.get("load_in_8bit"):
            return 1.0
        absmax = 1 + 4 / BNB_NESTED_BLOCKS if quant.get("bnb_4bit_use_double_quant") else 4
        return 0.5 + absmax / BNB_4BIT_BLOCK
    if method == "mxfp4":
        return 0.5 + 1 / MX_BLOCK
    if method == "modelopt" and "FP4" in str(quant.get("quant_algo", "")).upper():
        return 0.5 + 1 / NVFP4_BLOCK
    if method == "modelopt":
        return 1.0
    return None


def scheme(quant: dict[str, Any]) -> Scheme | None:
    per_weight = bytes_per_weight(quant)
    if per_weight is None:
        return None
    skipped: list[str] = []
    for key in SKIP_KEYS:
        value = quant.get(key)
        if isinstance(value, list):
            skipped += [str(v)[:256] for v in value[:1024] if isinstance(v, str)]
    # The LM head stays at the model's dtype unless compressed-tensors targets it (every
    # Linear not ignored) or GPTQ was asked to (lm_head = true).
    method = str(quant.get("quant_method", "")).lower()
    if not (method == "compressed-tensors" or (method == "gptq" and quant.get("lm_head") is True)):
        skipped.append("lm_head")
    return Scheme(bytes_per_weight=per_weight, skipped=tuple(skipped))


def estimate(shape: Shape, dtype_bytes: int, quant: Scheme | None) -> int:
    """Weight bytes: each module group at its quantized or its dtype's bytes per weight
    (the token embeddings are never quantized: no method above does)."""
    total = 0.0
    for module, params in module_groups(shape).items():
        quantized = (
            quant is not None
            and module != "model.embed_tokens"
            and not any(_matches(p, module) for p in quant.skipped)
        )
        total += params * (quant.bytes_per_weight if quant and quantized else dtype_bytes)
    return int(total)
