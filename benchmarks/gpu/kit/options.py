"""An experiment's command line: ``--out DIR`` and the knobs experiments share, each
named here once with what it means; its default is the experiment's own."""

from __future__ import annotations

import argparse
from pathlib import Path

SHARED: dict[str, tuple[type, str]] = {
    "pool_gib": (float, "the staged arm's GPU KV pool, GiB"),
    "reference_gib": (float, "the all-GPU arm's KV pool, GiB"),
    "extension_gib": (float, "the host extension (kv_offload.host_extension_gib), GiB"),
    "tier_gib": (float, "the CPU tier, GiB"),
    "pool_tokens": (int, "the GPU KV pool, tokens"),
    "long_tokens": (int, "the long request's prompt, tokens"),
    "output_tokens": (int, "tokens each request generates"),
    "chunk_tokens": (int, "gpu.prefill_chunk_tokens"),
    "docs": (int, "documents sent"),
    "doc_tokens": (int, "tokens a document"),
    "arms": (str, "the arms to run, comma separated"),
    "weights": (Path, "a checkpoint folder (default: dummy weights)"),
}


def parser(doc: str, **defaults: object) -> argparse.ArgumentParser:
    """The parser of the experiment whose docstring is ``doc``: ``--out`` (the folder it
    writes, required) and each shared knob named in ``defaults`` with its default."""
    made = argparse.ArgumentParser(description=doc.splitlines()[0])
    made.add_argument("--out", type=Path, required=True, help="the folder it writes")
    for name, default in defaults.items():
        kind, meaning = SHARED[name]
        made.add_argument("--" + name.replace("_", "-"), type=kind, default=default, help=meaning)
    return made
