from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest


@pytest.fixture
def as_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU platform claiming CUDA, offline: the engine core's side of our patches
    runs no CUDA; it only refuses other platforms. vLLM's model loader is imported first:
    a ModelConfig inspects the model once per machine (then cached in ~/.cache/vllm), and
    that import under a CUDA claim reaches for FlashAttention's CUDA build (found when these
    files ran alone on a fresh machine; in the whole suite an earlier test had cached it)."""
    import vllm.model_executor.model_loader  # noqa: F401
    from vllm.platforms import current_platform

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(type(current_platform), "is_cuda", lambda self: True)


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
