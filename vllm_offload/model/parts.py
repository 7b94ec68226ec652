"""A multi-part model's components (a vision or audio tower, the projector, the language
model) with their bytes, and the parameter names vLLM 0.32's weight offloader matches
``weights_offload.params`` (``--cpu-offload-params``) against (issue #46).

What the offloader sees (vllm/model_executor/offloader/uva.py ``_maybe_offload_to_cpu``:
a pattern matches when ``.pattern.`` is inside ``.prefix.name.``):

- a tower's parameters with the tower's module name in front: ``_mark_tower_model``
  (models/interfaces.py) wraps each tower with ``prefix=name``, so ``visual`` or
  ``visual.merger`` match Qwen2.5-VL's vision tower or its projector;
- a decoder layer's parameters *relative to the layer*: ``make_layers``
  (models/utils.py) passes no prefix, so ``mlp`` or ``self_attn.qkv_proj`` match every
  layer's, and ``language_model``, ``model.layers.0`` or ``q_proj`` (vLLM fuses it into
  ``qkv_proj``) match nothing;
- nothing else (embeddings, the final norm and the LM head stay on the GPU).

The prefetch backend wraps decoder layers only (``supports_tower_offload`` is False).
Names come from the safetensors headers when there are some, else from config.json's
standard layout. Parameter counts are checked against ranges by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["vision tower", "audio tower", "projector", "language model"]
_ORDER: tuple[Kind, ...] = ("vision tower", "audio tower", "projector", "language model")
LANGUAGE_MODEL = "language_model"
MAX_WIDTH = 1 << 20
MAX_DEPTH = 1024


class PartsError(ValueError):
    """config.json's tower section is not one the planner can read; the text says which key."""


@dataclass(frozen=True, kw_only=True)
class Component:
    """One part of the model as vLLM names its module, its bytes at the checkpoint's dtype,
    and its parameters as the offloader matches them (``names_known`` False: only the
    module name is known, so a pattern is taken if it starts with it)."""

    name: str
    kind: Kind
    bytes: int
    param_names: tuple[str, ...] = ()
    names_known: bool = True

    def matches(self, pattern: str) -> bool:
        """Whether vLLM's segment match of ``pattern`` takes one of this part's parameters
        (a language model whose layer names are unknown may have any: never refused)."""
        if not self.names_known and self.kind == "language model":
            return True
        if not self.names_known and f".{pattern}.".startswith(f".{self.name}."):
            return True
        return any(f".{pattern}." in f".{name}." for name in self.param_names)


@dataclass(frozen=True, kw_only=True)
class _Tower:
    name: str  # vLLM's module name
    kind: Kind
    checkpoint: tuple[str, ...]  # the prefixes its tensors have in a checkpoint


def _both(name: str, kind: Kind) -> _Tower:
    # Checkpoints saved by transformers >= 4.52 put the towers under "model."
    return _Tower(name=name, kind=kind, checkpoint=(f"{name}.", f"model.{name}."))


_LLAVA_STYLE = (_both("vision_tower", "vision tower"), _both("multi_modal_projector", "projector"))
# By config.json's model_type, as each vLLM model class assigns its towers (first prefix
# wins: Qwen's projector lives inside its vision tower).
TOWERS: dict[str, tuple[_Tower, ...]] = {
    "qwen2_5_vl": (_both("visual.merger", "projector"), _both("visual", "vision tower")),
    "qwen2_vl": (_both("visual.merger", "projector"), _both("visual", "vision tower")),
    "llava": _LLAVA_STYLE,
    "mistral3": _LLAVA_STYLE,
    "gemma3": _LLAVA_STYLE,
    "qwen2_audio": (
        _both("audio_tower", "audio tower"),
        _both("multi_modal_projector", "projector"),
    ),
}

# vLLM's fused linear layers (each model's packed_modules_mapping; experts as FusedMoE names).
_FUSED = (
    (re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|w1|w3)\.weight$"), ".experts.w13_weight"),
    (re.compile(r"\.experts\.\d+\.(down_proj|w2)\.weight$"), ".experts.w2_weight"),
    (re.compile(r"\.(q_proj|k_proj|v_proj)\."), ".qkv_proj."),
    (re.compile(r"\.(gate_proj|up_proj)\."), ".gate_up_proj."),
)
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.\d+\.(.+)$")  # Llama, GPT-2, MPT


def vllm_name(name: str) -> str:
    """A checkpoint's parameter name as vLLM's module holds it (fused projections)."""
    dotted = f".{name}"
    for pattern, fused in _FUSED:
        dotted = pattern.sub(fused, dotted)
    return dotted[1:]


def _tower_of(name: str, towers: tuple[_Tower, ...]) -> tuple[_Tower, str] | None:
    for tower in towers:
        for prefix in tower.checkpoint:
            if name.startswith(prefix):
                return tower, f"{tower.name}.{name[len(prefix) :]}"
    return None


def from_tensors(model_type: str, tensors: dict[str, float]) -> tuple[Component, ...]:
    """The components of a checkpoint whose headers list ``tensors`` (name: bytes)."""
    towers = TOWERS.get(model_type, ())
    sizes: dict[str, float] = {}
    names: dict[str, set[str]] = {}
    for name, size in tensors.items():
        found = _tower_of(name, towers)
        part = found[0].name if found else LANGUAGE_MODEL
        sizes[part] = sizes.get(part, 0.0) + size
        if found:
            names.setdefault(part, set()).add(vllm_name(found[1]))
        elif layer := _LAYER.search(name):
            names.setdefault(part, set()).add(vllm_name(layer.group(1)))
    kinds = {tower.name: tower.kind for tower in towers}
    return _ordered(
        Component(
            name=part,
            kind=kinds.get(part, "language model"),
            bytes=int(sizes[part]),
            param_names=tuple(sorted(names.get(part, ()))),
            names_known=part != LANGUAGE_MODEL or part in names,
        )
        for part in [*(t.name for t in towers), LANGUAGE_MODEL]
        if part in sizes
    )


def _ordered(parts: Iterable[Component]) -> tuple[Component, ...]:
    """Towers, then projectors, then the language model (as a reader meets them)."""
    return tuple(sorted(parts, key=lambda part: _ORDER.index(part.kind)))


def decoder_layer_names(moe: bool) -> tuple[str, ...]:
    """A standard decoder layer's parameters as vLLM names them (config.json alone)."""
    mlp = (
        ("mlp.experts.w13_weight", "mlp.experts.w2_weight", "mlp.gate.weight")
        if moe
        else (
            "mlp.gate_up_proj.weight",
            "mlp.down_proj.weight",
        )
    )
    return (
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.qkv_proj.weight",
        "self_attn.o_proj.weight",
        *mlp,
    )


def _width(cfg: dict[str, Any], key: str, default: int | None = None, high: int = MAX_WIDTH) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise PartsError(f"'{key}' is missing or not a whole number from 1 to {high:,}")
    return value


def _qwen25_vision(vc: dict[str, Any], dtype_bytes: int) -> tuple[Component, ...]:
    """Qwen2.5-VL's vision transformer and its patch merger (vLLM qwen2_5_vl.py)."""
    h, inter = _width(vc, "hidden_size"), _width(vc, "intermediate_size")
    depth = _width(vc, "depth", high=MAX_DEPTH)
    channels = _width(vc, "in_channels", vc.get("in_chans", 3), high=16)
    patch = _width(vc, "patch_size", 14, high=1024) ** 2 * _width(vc, "temporal_patch_size", 2)
    merged = h * _width(vc, "spatial_merge_size", 2, high=64) ** 2
    out = _width(vc, "out_hidden_size")
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * (h * inter + inter) + inter * h + h
    tower = channels * patch * h + depth * block
    merger = h + merged * merged + merged + merged * out + out
    layer = (
        "norm1.weight",
        "norm2.weight",
        "attn.qkv.weight",
        "attn.qkv.bias",
        "attn.proj.weight",
        "attn.proj.bias",
        "mlp.gate_up_proj.weight",
        "mlp.gate_up_proj.bias",
        "mlp.down_proj.weight",
        "mlp.down_proj.bias",
    )
    blocks = tuple(f"visual.blocks.{i}.{name}" for i in range(depth) for name in layer)
    merger_names = ("ln_q.weight", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")
    return (
        Component(
            name="visual.merger",
            kind="projector",
            bytes=merger * dtype_bytes,
            param_names=tuple(f"visual.merger.{n}" for n in merger_names),
        ),
        Component(
            name="visual",
            kind="vision tower",
            bytes=tower * dtype_bytes,
            param_names=("visual.patch_embed.proj.weight", *blocks),
        ),
    )


def _vit(vc: dict[str, Any], text_hidden: int, projector_layers: int) -> tuple[int, int]:
    """A CLIP/SigLIP-style ViT's parameters and its projector's (LLaVA: two linear layers;
    Gemma 3: one)."""
    h, inter = _width(vc, "hidden_size"), _width(vc, "intermediate_size")
    layers = _width(vc, "num_hidden_layers", high=MAX_DEPTH)
    patch = _width(vc, "patch_size", 14, high=1024)
    positions = (_width(vc, "image_size", 224, high=1 << 16) // patch) ** 2
    embeddings = _width(vc, "num_channels", 3, high=16) * patch * patch * h + positions * h
    layer = 4 * (h * h + h) + 2 * h * inter + inter + 5 * h
    projector = h * text_hidden + (projector_layers - 1) * text_hidden * text_hidden
    return embeddings + layers * layer, projector


def from_config(
    raw: dict[str, Any], text_hidden: int, dtype_bytes: int, text_bytes: int, moe: bool
) -> tuple[tuple[Component, ...], list[str]]:
    """The components config.json alone gives (the language model's bytes: ``text_bytes``),
    and what it could not size, in words."""
    model_type = str(raw.get("model_type", ""))
    vc = raw.get("vision_config")
    towers: tuple[Component, ...] = ()
    unknown: list[str] = []
    try:
        if model_type == "qwen2_5_vl" and isinstance(vc, dict):
            towers = _qwen25_vision(vc, dtype_bytes)
        elif model_type in ("llava", "mistral3", "gemma3") and isinstance(vc, dict):
            tower, projector = TOWERS[model_type]
            vit, mlp = _vit(vc, text_hidden, 1 if model_type == "gemma3" else 2)
            towers = (
                Component(
                    name=tower.name, kind=tower.kind, bytes=vit * dtype_bytes, names_known=False
                ),
                Component(
                    name=projector.name,
                    kind="projector",
                    bytes=mlp * dtype_bytes,
                    names_known=False,
                ),
            )
        elif any(isinstance(raw.get(k), dict) for k in ("vision_config", "audio_config")):
            unknown.append(f"the towers of model_type {model_type[:40]!r} (planned without them)")
    except PartsError as exc:
        unknown.append(f"the vision tower: vision_config {exc} (planned without it)")
    language = Component(
        name=LANGUAGE_MODEL,
        kind="language model",
        bytes=text_bytes,
        param_names=decoder_layer_names(moe),
    )
    return _ordered((*towers, language)), unknown


def matching(pattern: str, parts: Iterable[Component]) -> list[Component]:
    """The components ``pattern`` takes parameters of."""
    return [part for part in parts if part.matches(pattern)]
