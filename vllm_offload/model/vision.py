"""What vLLM's start-up profile pushes through a vision encoder (issue #46), from
config.json's vision_config and the image processor's preprocessor_config.json.

vLLM measures the memory it leaves for the KV pool after a profile run that encodes one
multimodal item as large as its encoder budget: max(max_num_batched_tokens, the largest
item's visual tokens) ("Encoder cache will be initialized with a budget of N tokens",
vLLM 0.33). For Qwen2-VL and Qwen2.5-VL a visual token is spatial_merge_size² patches of
the vision transformer, and the largest image has the processor's max_pixels:
max_pixels / (patch_size x spatial_merge_size)² tokens. Measured on an H200 (a
Qwen2.5-VL-7B shape, vLLM 0.33.0, docs/benchmarks.md "A vision tower in host RAM"):
vLLM's peak activation grew 0.46 and 0.54 GiB per 16,384 patches, where
plan.working_memory's activation formula on the vision config gives 0.47.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# The published Qwen2-VL / Qwen2.5-VL processors' max_pixels (16,384 visual tokens), the
# largest in use: planned where a folder has no preprocessor_config.json to say.
DEFAULT_MAX_PIXELS = 12_845_056
MAX_PIXELS_HIGH = 1 << 32
_WIDTH_HIGH = 1 << 16


@dataclass(frozen=True, kw_only=True)
class VisionProfile:
    """One vision transformer's shape, and the largest image vLLM profiles it with."""

    width: int  # the transformer's hidden size
    intermediate: int  # its MLP's width
    patches_per_token: int  # spatial_merge_size²: patches merged into one visual token
    max_item_tokens: int  # the largest image's visual tokens
    max_pixels_from: Literal["preprocessor_config.json", "default"]

    def profile_tokens(self, chunk_tokens: int) -> int:
        """vLLM's encoder budget beside a prefill chunk of ``chunk_tokens``."""
        return max(chunk_tokens, self.max_item_tokens)


def _bounded(value: object, high: int) -> int | None:
    """``value`` if it is a whole number from 1 to ``high``, else None (untrusted files)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        return None
    return value


def _whole(cfg: dict[str, Any], key: str, default: int, high: int = _WIDTH_HIGH) -> int | None:
    return _bounded(cfg.get(key, default), high)


def _max_pixels(preprocessor: dict[str, Any] | None) -> int | None:
    """The processor's max_pixels (older files) or size.longest_edge (newer ones)."""
    if preprocessor is None:
        return None
    size = preprocessor.get("size")
    longest = size.get("longest_edge") if isinstance(size, dict) else None
    return _bounded(preprocessor.get("max_pixels", longest), MAX_PIXELS_HIGH)


def read(
    model_type: str, vision_config: object, preprocessor: dict[str, Any] | None
) -> VisionProfile | None:
    """The profile of a Qwen2-VL or Qwen2.5-VL vision encoder; None for other models, or a
    vision_config out of range (the components' reading says what it could not size)."""
    if model_type not in ("qwen2_vl", "qwen2_5_vl") or not isinstance(vision_config, dict):
        return None
    vc = vision_config
    if model_type == "qwen2_vl":  # embed_dim wide, mlp_ratio x as wide an MLP
        width, ratio = _whole(vc, "embed_dim", 0), _whole(vc, "mlp_ratio", 4, 64)
        inter = width * ratio if width and ratio else None
    else:
        width, inter = _whole(vc, "hidden_size", 0), _whole(vc, "intermediate_size", 0)
    merge, patch = _whole(vc, "spatial_merge_size", 2, 64), _whole(vc, "patch_size", 14, 1024)
    if not (width and inter and merge and patch):
        return None
    read_pixels = _max_pixels(preprocessor)
    pixels = read_pixels or DEFAULT_MAX_PIXELS
    return VisionProfile(
        width=width,
        intermediate=inter,
        patches_per_token=merge * merge,
        max_item_tokens=max(1, pixels // (patch * merge) ** 2),
        max_pixels_from="preprocessor_config.json" if read_pixels else "default",
    )
