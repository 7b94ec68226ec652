from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from tests.test_patching import pristine_025
from vllm_offload import patching


@contextmanager
def collect_logs(name: str) -> Iterator[list[str]]:
    """Messages logged to a vLLM logger at INFO and above (vLLM's loggers do not propagate
    to pytest's caplog, and a bare import leaves their level unset)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger(name)
    handler, level = Collect(), logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@contextmanager
def patched_025(tmp_path: Path, relpath: str) -> Iterator[ModuleType]:
    """A module of vLLM 0.25.0 with its series applied, loaded from its pristine sources
    under another name beside the installed 0.32.0 (whose vllm.* it imports)."""
    site = pristine_025(tmp_path)
    patching.apply(site)
    name = "vllm._vllm_offload_025." + relpath.removesuffix(".py").replace("/", ".")
    spec = importlib.util.spec_from_file_location(name, site / relpath)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
