"""What the disk tier leaves on disk, found and removed without following links.

vLLM's filesystem tier writes ``<root>/<model>_<hash>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin``
(through ``<name>.bin.tmp``) plus a ``config.json`` per namespace. The server's disk
tier (``disk_tier``) and ``vllm-offload cache clear`` share these rules, so clearing
deletes exactly what the tier wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vllm_offload.errors import Refused

BLOCK_FILE_SUFFIX = ".bin"
PARTIAL_FILE_SUFFIX = ".tmp"  # vLLM writes <name>.bin.tmp, then renames it
NAMESPACE_FILE = "config.json"
# A running server holds this shared; clearing takes it exclusively, so it never deletes
# under a server (and a server starting meanwhile waits for the clear to finish).
LOCK_FILE = ".vllm-offload-disk-tier.lock"
# What the running tier holds, written by it every few seconds for the manager's page.
STATUS_FILE = ".vllm-offload-disk-tier.json"


def write_status(root: Path, status: dict[str, float]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{STATUS_FILE}.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(status, f)
    os.replace(tmp, root / STATUS_FILE)


def read_status(path: str) -> dict[str, float] | None:
    """The running (or last) tier's own account of what it holds; None if there is none."""
    try:
        status = json.loads((Path(path) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def hold(root: Path) -> int:
    """Lock ``root`` as in use for as long as this process keeps the returned fd."""
    fd = os.open(root / LOCK_FILE, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def block_files(root: Path) -> Iterator[os.DirEntry[str]]:
    """Every block file (and cut-short write) under ``root``; symbolic links are neither
    followed nor listed."""
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False) and entry.name.endswith(
                (BLOCK_FILE_SUFFIX, PARTIAL_FILE_SUFFIX)
            ):
                yield entry


def clear(root: Path) -> tuple[int, int]:
    """Delete the tier's files under ``root`` (block files, namespace config files, its
    status file) and the directories that leaves empty; nothing else (the lock file stays:
    a server starting meanwhile may be waiting on it). Returns (files, bytes) removed."""
    files = removed = 0
    (root / STATUS_FILE).unlink(missing_ok=True)
    for entry in block_files(root):
        size = entry.stat(follow_symlinks=False).st_size
        Path(entry.path).unlink(missing_ok=True)
        files, removed = files + 1, removed + size
    for directory, subdirectories, filenames in os.walk(root, topdown=False):
        here = Path(directory)
        if here == root:
            continue
        # A namespace's config.json goes with its last block file: only from a folder that
        # holds nothing else.
        if filenames == [NAMESPACE_FILE] and not any((here / d).exists() for d in subdirectories):
            (here / NAMESPACE_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            here.rmdir()  # only if empty: anything not the tier's stays
    return files, removed


def clear_tier(path: str) -> tuple[int, int]:
    """Empty the disk tier at ``path`` (kv_offload.disk_path); refused while a server uses
    it. Returns (files, bytes) removed."""
    if not path:
        raise Refused("kv_offload.disk_path", "empty: this config has no disk tier to clear")
    root = Path(path)
    if not root.is_dir():
        raise Refused("kv_offload.disk_path", f"{path} does not exist: nothing to clear")
    fd = os.open(root / LOCK_FILE, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Refused(
                "kv_offload.disk_path",
                f"a running server uses the disk tier at {path}; stop it first (`vllm-offload "
                "service stop` or the page's Stop), then clear",
            ) from None
        return clear(root)
    finally:
        os.close(fd)
