"""What the disk tier leaves on disk, found and removed without following links.

vLLM's filesystem tier writes ``<root>/<model>_<hash>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin``
(through ``<hash>.bin_<n>.tmp``) plus a ``config.json`` per namespace; ``root`` is
``<kv_offload.disk_path>/vllm-offload-kv/<model fingerprint>``. The server's disk tier
(``disk_tier``) and ``vllm-offload cache clear`` share these rules, so clearing deletes
exactly what the tier wrote, and never a file beside its folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vllm_offload.errors import Refused

# The tier keeps everything in this folder of kv_offload.disk_path, never beside it, and
# within it touches only names of vLLM's layout: a chunk is a hex hash + ".bin", a write in
# progress that + "_<digits>.tmp" (vllm/v1/kv_offload/tiering/fs/io.py).
TIER_DIR = "vllm-offload-kv"
BLOCK_FILE = re.compile(r"[0-9a-f]{8,128}\.bin")
PARTIAL_FILE = re.compile(r"[0-9a-f]{8,128}\.bin_[0-9]+\.tmp")
NAMESPACE_FILE = "config.json"
# A running server holds this exclusively (one server per tier); clearing takes it too,
# so it never deletes under a server.
LOCK_FILE = ".lock"
# What the running tier holds, written by it every few seconds for the manager's page.
STATUS_FILE = ".status.json"


def tier_root(disk_path: str) -> Path:
    return Path(disk_path) / TIER_DIR


def _lock(root: Path) -> int:
    """Take ``root``'s lock without waiting; BlockingIOError if it is held."""
    fd = os.open(root / LOCK_FILE, os.O_CREAT | os.O_RDONLY | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold(root: Path) -> int:
    """Lock the tier at ``root`` as in use for as long as this process keeps the fd."""
    root.mkdir(parents=True, exist_ok=True)
    try:
        return _lock(root)
    except BlockingIOError:
        raise RuntimeError(
            f"another server (or `vllm-offload cache clear`) uses the disk tier at {root}; "
            "give each server its own kv_offload.disk_path"
        ) from None


def write_status(root: Path, status: dict[str, float]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{STATUS_FILE}.", dir=root)
    with os.fdopen(fd, "w") as f:
        json.dump(status, f)
    os.replace(tmp, root / STATUS_FILE)


def read_status(disk_path: str) -> dict[str, float] | None:
    """The running (or last) tier's own account of what it holds; None if there is none."""
    try:
        status = json.loads((tier_root(disk_path) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


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
            elif entry.is_file(follow_symlinks=False) and (
                BLOCK_FILE.fullmatch(entry.name) or PARTIAL_FILE.fullmatch(entry.name)
            ):
                yield entry


def clear(root: Path) -> tuple[int, int]:
    """Delete the tier's files under ``root`` (block files, namespace config files, its
    status file) and the directories that leaves empty; nothing else (the lock file stays:
    the clear holds it). Returns (files, bytes) removed."""
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
    """Empty the disk tier of ``path`` (kv_offload.disk_path); refused while a server uses
    it. Returns (files, bytes) removed."""
    if not path:
        raise Refused("kv_offload.disk_path", "empty: this config has no disk tier to clear")
    root = tier_root(path)
    if not root.is_dir():
        raise Refused("kv_offload.disk_path", f"{root} does not exist: nothing to clear")
    try:
        fd = _lock(root)
    except BlockingIOError:
        raise Refused(
            "kv_offload.disk_path",
            f"a running server uses the disk tier at {root}; stop it first (`vllm-offload "
            "service stop` or the page's Stop), then clear",
        ) from None
    except OSError as exc:
        raise Refused("kv_offload.disk_path", f"cannot lock {root}: {exc.strerror}; run "
                      "this as the server's user") from None  # fmt: skip
    try:
        return clear(root)
    except OSError as exc:
        raise Refused("kv_offload.disk_path", f"cannot clear {root}: {exc.strerror}; run "
                      "this as the server's user") from None  # fmt: skip
    finally:
        os.close(fd)
