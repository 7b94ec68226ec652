"""A safetensors file's header: the 8-byte little-endian length, then that many bytes of
JSON naming each tensor's dtype and shape. Only the header is read, never the weights.

A model folder is untrusted input: the length is bounded (the format's own 100 MB limit),
the JSON is refused when garbled, not an object, or holding a tensor without a valid
shape and dtype, and every message names the file.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from vllm_offload.safe_files import open_regular, parse_json

# safetensors dtype tags -> bytes per element
SAFETENSORS_BYTES: dict[str, float] = {
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
    "F8_E8M0": 1,  # MXFP4's block scales
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
    "F4": 0.5,
    "C64": 8,
}

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
MAX_TENSOR_ELEMENTS = 1 << 50


class HeaderError(ValueError):
    """A header the planner refuses; the text names the file and what is wrong."""


def read_header(path: Path) -> dict[str, Any]:
    """The header of the safetensors file at ``path`` (a regular file; OSError if unreadable)."""
    with open_regular(path) as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise HeaderError(f"{path.name}: truncated safetensors file")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > MAX_HEADER_BYTES:
            raise HeaderError(
                f"{path.name}: safetensors header too large ({header_len:,} bytes; the format "
                f"allows {MAX_HEADER_BYTES:,})"
            )
        data = f.read(header_len)
    try:
        header = parse_json(data)
    except ValueError as exc:
        raise HeaderError(
            f"{path.name}: garbled safetensors header: not valid JSON ({str(exc)[:200]})"
        ) from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name}: garbled safetensors header (not an object)")
    return header


def tensor_bytes(file: str, name: str, entry: Any) -> float:
    """One tensor's bytes from its header entry (``file``: where it is, for the message)."""
    shape = entry.get("shape") if isinstance(entry, dict) else None
    dtype = entry.get("dtype") if isinstance(entry, dict) else None
    if not isinstance(shape, list) or not isinstance(dtype, str) or len(shape) > 16:
        raise HeaderError(f"{file}: tensor {name[:80]!r} has no valid shape and dtype")
    count = 1
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise HeaderError(f"{file}: tensor {name[:80]!r} has a bad dimension")
        count *= dim
        if count > MAX_TENSOR_ELEMENTS:
            raise HeaderError(f"{file}: tensor {name[:80]!r} is larger than any model's")
    return count * SAFETENSORS_BYTES.get(dtype, 2)


def tensor_sizes(headers: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each tensor's bytes as the headers (by file name) declare them."""
    sizes: dict[str, float] = {}
    for file, header in headers.items():
        for name, entry in header.items():
            if name != "__metadata__":
                sizes[name] = sizes.get(name, 0.0) + tensor_bytes(file, name, entry)
    return sizes
