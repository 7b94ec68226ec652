from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


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
