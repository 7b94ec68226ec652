"""What the planner needs to know about a model, read from its local HF directory.

Only ``config.json`` and the safetensors *headers* are read; no weights, no
vLLM import. The record is immutable and small.

A model folder is untrusted input (anyone who can write a model root can plant files
there): only regular files are read, each within a size cap, JSON without NaN or
Infinity, and every number the planner uses is checked against a range real models
keep (200,000,000 layers once kept the manager busy for twelve minutes).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vllm_offload.model import limit as model_limit
from vllm_offload.model import parts as model_parts
from vllm_offload.model import safetensors_header, weight_estimate
from vllm_offload.model import vision as vision_profile
from vllm_offload.model.config_json import (
    MAX_LAYERS,
    MAX_TOKENS,
    MAX_VOCAB,
    LayerKind,
    ModelFactsError,
    experts_per_token,
    layer_kinds,
    optional_number,
    parameter_shape,
    routed_experts,
    short_text,
    text_config,
    whole_number,
)
from vllm_offload.safe_files import parse_json, read_regular

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

MAX_CONFIG_BYTES = 16 * 1024 * 1024
# A mixture of experts whose config.json names no experts per token: planned as the
# widest common routing (Qwen3-MoE, Mixtral's 2 is narrower), so its workspaces are not
# undercounted.
MOE_TOP_K_UNREAD = 8
MAX_WEIGHT_FILES = 4096


@dataclass(frozen=True, kw_only=True)
class ModelFacts:
    path: str
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    # the longest max_model_len vLLM accepts (0: config.json names none), and from where
    max_len_limit: int
    torch_dtype: str
    quantization: str | None
    layers: tuple[LayerKind, ...]
    weight_bytes: int
    weight_bytes_source: Literal["safetensors", "parameter count"]
    vocab_size: int = 0
    tie_word_embeddings: bool = False
    experts: int = 0  # routed experts a layer (0: a dense model)
    experts_per_token: int = 0  # routed experts a token goes through (0: a dense model)
    intermediate_size: int = 0  # the dense MLP's width (0: not read; 4 x hidden)
    moe_intermediate_size: int = 0  # one expert's width (0: not read; intermediate_size)
    max_len_key: str = "max_position_embeddings"
    unknown: tuple[str, ...] = ()  # what could not be read, in words
    # vision/audio towers, projector, language model: their bytes and what the offloader
    # matches weights_offload.params against (model_parts)
    components: tuple[model_parts.Component, ...] = ()
    # a vision encoder vLLM profiles at start-up, and the largest image it profiles
    vision: vision_profile.VisionProfile | None = None
    # config.json's bytes and every weight file's name, size and mtime, hashed: the disk
    # tier keeps a model's KV under it, so changed weights at the same path find none.
    fingerprint: str = ""

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.torch_dtype, 2)


def _json(data: bytes, what: str) -> Any:
    try:
        return parse_json(data)
    except ValueError as exc:
        raise ModelFactsError(f"{what}: not valid JSON ({str(exc)[:200]})") from None


def _weight_files(model_dir: Path, patterns: tuple[str, ...]) -> list[Path]:
    files = sorted({f for pattern in patterns for f in model_dir.glob(pattern)})
    if len(files) > MAX_WEIGHT_FILES:
        raise ModelFactsError(f"{model_dir}: more than {MAX_WEIGHT_FILES} weight files")
    return files


def read_safetensors_headers(model_dir: Path) -> dict[str, dict[str, Any]] | None:
    """Each safetensors file's header by file name; None when there are none."""
    files = _weight_files(model_dir, ("*.safetensors",))
    if not files:
        return None
    headers = {}
    for file in files:
        try:
            headers[file.name] = safetensors_header.read_header(file)
        except safetensors_header.HeaderError as exc:
            raise ModelFactsError(str(exc)) from None
        except OSError as exc:
            raise ModelFactsError(f"{file.name}: cannot read it ({exc})") from None
    return headers


WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf")


def fingerprint(model_dir: Path, config_bytes: bytes) -> str:
    """``config_bytes`` (config.json's) and every weight file's name, size and mtime."""
    digest = hashlib.sha256(config_bytes)
    for weights in _weight_files(model_dir, WEIGHT_FILE_PATTERNS):
        stat = weights.stat()
        digest.update(f"{weights.name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def folder_fingerprint(model_dir: Path) -> str:
    """The model folder's fingerprint as it is now (what a plan of it read)."""
    return fingerprint(model_dir, _read_config(model_dir)[0])


def _read_config(model_dir: Path) -> tuple[bytes, dict[str, Any]]:
    """config.json's bytes and its object."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelFactsError(
            f"{model_dir}: not a Hugging Face model directory (no config.json); "
            "point model.path at the folder holding config.json and the weights"
        )
    try:
        data = read_regular(config_path, MAX_CONFIG_BYTES)
    except OSError as exc:
        raise ModelFactsError(f"{config_path}: cannot read it ({exc})") from None
    return data, config_object(data, str(config_path))


def read(model_dir: Path) -> ModelFacts:
    """Read a local HF model directory; raise ModelFactsError saying what is wrong."""
    if not model_dir.is_dir():
        raise ModelFactsError(f"{model_dir}: no such directory")
    config_bytes, raw = _read_config(model_dir)
    return facts_of(
        str(model_dir),
        raw,
        read_safetensors_headers(model_dir),
        fingerprint(model_dir, config_bytes),
        _read_preprocessor(model_dir),
    )


def _read_preprocessor(model_dir: Path) -> dict[str, Any] | None:
    """The image processor's preprocessor_config.json, where there is a readable one (a
    planted, oversized or malformed file reads as none: the plan then takes the largest
    image in use, vision_profile.DEFAULT_MAX_PIXELS)."""
    path = model_dir / "preprocessor_config.json"
    try:
        return config_object(read_regular(path, MAX_CONFIG_BYTES), str(path))
    except (OSError, ModelFactsError):
        return None


def config_object(data: bytes, what: str) -> dict[str, Any]:
    """config.json's ``data`` as its object (``what``: where it came from, for errors)."""
    raw = _json(data, what)
    if not isinstance(raw, dict):
        raise ModelFactsError(f"{what}: expected a JSON object")
    return raw


def facts_of(
    path: str,
    raw: dict[str, Any],
    headers: dict[str, dict[str, Any]] | None,
    print_: str,
    preprocessor: dict[str, Any] | None = None,
) -> ModelFacts:
    """The facts of config.json's object ``raw`` and its safetensors ``headers`` by file
    (None: none; the weights estimated from the parameter count), read from a folder or
    from the hub (``path`` names which; ``print_`` its fingerprint; ``preprocessor``: the
    image processor's config, where there is one)."""
    cfg = text_config(raw)
    archs = cfg.get("architectures")
    architecture = archs[0] if isinstance(archs, list) and archs else "unknown"
    num_layers = whole_number(cfg, "num_hidden_layers", MAX_LAYERS)
    hidden = whole_number(cfg, "hidden_size")
    heads = whole_number(cfg, "num_attention_heads")
    kv_heads = optional_number(cfg, "num_key_value_heads", heads)
    head_dim = optional_number(cfg, "head_dim", hidden // heads)
    if head_dim < 1:
        raise ModelFactsError("config.json: 'hidden_size' is smaller than its head count")
    dtype = short_text(cfg, "torch_dtype", "") or short_text(cfg, "dtype", "") or "bfloat16"
    quant = cfg.get("quantization_config")
    layers, unknown = layer_kinds(cfg, num_layers)
    limit, limit_key = model_limit.max_len_limit(cfg)
    optional_number(cfg, "max_position_embeddings", 0, MAX_TOKENS)  # a crafted one is refused
    model_type = short_text(raw, "model_type", "unknown")
    inter = optional_number(cfg, "intermediate_size", 4 * hidden)
    experts, top_k = routed_experts(cfg), experts_per_token(cfg)
    if experts and not top_k:
        top_k = MOE_TOP_K_UNREAD
        unknown.append(f"experts per token (num_experts_per_tok; planned as {top_k})")
    if headers:
        weight_bytes, parts = read_weights(headers, model_type)
        source: Literal["safetensors", "parameter count"] = "safetensors"
    else:
        shape = parameter_shape(
            cfg, layers=num_layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim
        )
        weight_bytes, parts, missing = estimated_weights(raw, cfg, dtype, shape)
        unknown += missing
        source = "parameter count"
    vision = vision_profile.read(model_type, raw.get("vision_config"), preprocessor)
    if vision is None and isinstance(raw.get("vision_config"), dict):
        unknown.append(
            f"the vision encoder's start-up profile of model_type {model_type[:40]!r} "
            "(the pool planned without it: vLLM's may be smaller)"
        )
    return ModelFacts(
        path=path,
        architecture=str(architecture)[:256],
        model_type=short_text(cfg, "model_type", "unknown"),
        num_layers=num_layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        max_len_limit=min(limit, MAX_TOKENS),
        max_len_key=limit_key,
        torch_dtype=dtype,
        quantization=short_text(quant, "quant_method", "unknown")
        if isinstance(quant, dict)
        else None,
        layers=layers,
        weight_bytes=weight_bytes,
        weight_bytes_source=source,
        vocab_size=optional_number(cfg, "vocab_size", 0, MAX_VOCAB),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", cfg.get("tie_word_embeddings"))),
        experts=experts,
        experts_per_token=top_k,
        intermediate_size=inter,
        moe_intermediate_size=optional_number(cfg, "moe_intermediate_size", inter),
        vision=vision,
        unknown=tuple(unknown),
        fingerprint=print_,
        components=parts,
    )


def read_weights(
    headers: dict[str, dict[str, Any]], model_type: str
) -> tuple[int, tuple[model_parts.Component, ...]]:
    """The weights' bytes and components as the safetensors headers give them."""
    try:
        sizes = safetensors_header.tensor_sizes(headers)
    except safetensors_header.HeaderError as exc:
        raise ModelFactsError(str(exc)) from None
    return int(sum(sizes.values())), model_parts.from_tensors(model_type, sizes)


def estimated_weights(
    raw: dict[str, Any], cfg: dict[str, Any], dtype: str, shape: weight_estimate.Shape
) -> tuple[int, tuple[model_parts.Component, ...], list[str]]:
    """The weights' bytes and components from config.json's parameter counts (no
    safetensors headers), and what could not be read of them."""
    unknown = []
    quant = cfg.get("quantization_config")
    scheme = weight_estimate.scheme(quant) if isinstance(quant, dict) else None
    if isinstance(quant, dict) and scheme is None:
        method = short_text(quant, "quant_method", "unknown")
        unknown.append(f"quantization {method!r} (weights planned at 16 bits)")
    element_bytes = DTYPE_BYTES.get(dtype, 2)
    text_bytes = weight_estimate.estimate(shape, element_bytes, scheme)
    parts, missing = model_parts.from_config(
        raw, shape.hidden, element_bytes, text_bytes, shape.experts > 0
    )
    # the towers sit on the GPU too
    return sum(part.bytes for part in parts), parts, unknown + missing
