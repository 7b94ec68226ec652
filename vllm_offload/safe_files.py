"""Opening files that someone else may have planted: a model folder's files and the disk
tier's. Only regular files are read (a FIFO blocked every reader for good; a link to
/dev/zero was read until memory ran out), opening never blocks, and reads are capped.
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any


class UnsafeFile(OSError):
    """Not a regular file, or larger than the reader takes; the text says which."""


def open_regular(
    path: str | Path, *, follow_links: bool = True, dir_fd: int | None = None
) -> io.FileIO:
    """``path`` opened for reading if it is a regular file (``follow_links`` False: and
    not a link itself); raises UnsafeFile or OSError otherwise. O_NONBLOCK: opening a
    FIFO returns at once (and is then refused) instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(f"{path}: not a regular file")
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular(
    path: str | Path,
    max_bytes: int,
    *,
    follow_links: bool = True,
    dir_fd: int | None = None,
) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (UnsafeFile if larger, by its
    size or by what it yields: /proc files say 0)."""
    with open_regular(path, follow_links=follow_links, dir_fd=dir_fd) as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{path}: larger than {max_bytes:,} bytes")
    return data


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(data: bytes) -> Any:
    """JSON from a planted file: ValueError for invalid text, NaN, Infinity, numbers past
    a float's range (1e400) and nesting deep enough to exhaust Python's stack."""
    try:
        return json.loads(data, parse_float=_finite, parse_constant=_no_constant)
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(str(exc)) from None


MAX_SECRET_BYTES = 4096


def read_secret(path: str) -> str:
    """A key kept in a small regular file that other users cannot read nor its group write;
    raises OSError (unreadable) or ValueError saying what is wrong and the fix."""
    with open_regular(path) as file:
        mode = os.fstat(file.fileno()).st_mode & 0o777
        data = file.read(MAX_SECRET_BYTES + 1)
    if mode & 0o026:
        raise ValueError(
            f"{path} has mode {mode:o}: other users can read it, or its group can write it; "
            "chmod 600 it (640 to share it with the manager's group)"
        )
    key = data.decode(errors="replace").strip()
    if not key or len(data) > MAX_SECRET_BYTES:
        raise ValueError(f"{path}: write one key (up to {MAX_SECRET_BYTES} bytes) into it")
    return key
