"""What the disk tier leaves on disk, found and removed without following links.

vLLM's filesystem tier writes ``<root>/<model>_<hash>_r<rank>/<hhh>/<hh>_g<group>/<hash>.bin``
(through ``<hash>.bin_<n>.tmp``) plus a ``config.json`` per namespace; ``root`` is
``<kv_offload.disk_path>/vllm-offload-kv/<model fingerprint>``. The server's disk tier
(``disk_tier``) and ``vllm-offload cache clear`` share these rules, so clearing deletes
exactly what the tier wrote, and never a file beside its folder.

Everything in the tier's folder is written by the server's user, so by any code vLLM runs:
root's `cache clear` and the manager (another user) treat it as planted. They open the
folder without following a link at its name, work from that directory's fd (openat,
unlinkat, os.fwalk), create nothing through a link (O_NOFOLLOW), and read only regular
files, within a size cap.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from vllm_offload.errors import Refused
from vllm_offload.safe_files import UnsafeFile, parse_json, read_regular

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
MAX_STATUS_BYTES = 64 * 1024


class TierLinked(OSError):
    """The tier's folder is a symbolic link (planted: the tier never makes one)."""


def tier_root(disk_path: str) -> Path:
    return Path(disk_path) / TIER_DIR


def open_root(root: Path, *, create: bool = False) -> int:
    """A directory fd of the tier's folder ``root`` (``<disk_path>/vllm-offload-kv``),
    never through a link at its name (TierLinked); made first if ``create``. ``disk_path``
    itself is the administrator's and may be a link."""
    parent = os.open(root.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(root.name, dir_fd=parent)
        try:
            return os.open(
                root.name,
                os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                dir_fd=parent,
            )
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(root):
                raise TierLinked(
                    f"{root} is a symbolic link, which the disk tier never "
                    "makes; remove it (it is not followed)"
                ) from None
            raise
    finally:
        os.close(parent)


def _lock(root_fd: int) -> int:
    """Take the lock in the tier's folder without waiting; BlockingIOError if it is held.
    The lock file is created there, never through a link, and only a regular one is used
    (opening a FIFO would wait for a writer)."""
    flags = os.O_CREAT | os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(LOCK_FILE, flags, 0o644, dir_fd=root_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeFile(f"{LOCK_FILE} in the disk tier is not a regular file; remove it")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold(root: Path) -> int:
    """Lock the tier at ``root`` as in use for as long as this process keeps the fd."""
    root.parent.mkdir(parents=True, exist_ok=True)
    root_fd = open_root(root, create=True)
    try:
        return _lock(root_fd)
    except BlockingIOError:
        raise RuntimeError(
            f"another server (or `vllm-offload cache clear`) uses the disk tier at {root}; "
            "give each server its own kv_offload.disk_path"
        ) from None
    finally:
        os.close(root_fd)


def write_status(root: Path, status: dict[str, float]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{STATUS_FILE}.", dir=root)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o640)  # mkstemp's 0600 hid it from the manager's user
        json.dump(status, f)
    os.replace(tmp, root / STATUS_FILE)


def read_status(disk_path: str) -> dict[str, float] | None:
    """The running (or last) tier's own account of what it holds (its finite numbers);
    None if there is none or it is not a small regular file."""
    try:
        root_fd = open_root(tier_root(disk_path))
    except OSError:
        return None
    try:
        data = read_regular(STATUS_FILE, MAX_STATUS_BYTES, follow_links=False, dir_fd=root_fd)
        status = parse_json(data)
    except (OSError, ValueError):
        return None
    finally:
        os.close(root_fd)
    if not isinstance(status, dict):
        return None
    return {
        str(k): float(v)
        for k, v in status.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


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


def _clear_folder(folder_fd: int, subfolders: list[str], files: list[str]) -> tuple[int, int]:
    """In one folder of the tier (by its fd): delete the block files, then the subfolders
    that are empty by now, then a namespace's config.json left alone there."""
    count = size = 0
    for name in files:
        if BLOCK_FILE.fullmatch(name) or PARTIAL_FILE.fullmatch(name):
            found = os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISREG(found.st_mode):
                os.unlink(name, dir_fd=folder_fd)  # unlink never follows a link
                count, size = count + 1, size + found.st_size
    for name in subfolders:
        with contextlib.suppress(OSError):  # only if empty (a link is no folder: ENOTDIR)
            os.rmdir(name, dir_fd=folder_fd)
    return count, size


def clear(root_fd: int) -> tuple[int, int]:
    """Delete the tier's files under the folder ``root_fd`` (block files, namespace config
    files, its status file) and the folders that leaves empty; nothing else (the lock file
    stays: the clear holds it). Returns (files, bytes) removed."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(STATUS_FILE, dir_fd=root_fd)
    files = removed = 0
    walk = os.fwalk(".", topdown=False, follow_symlinks=False, dir_fd=root_fd)
    for here, subfolders, names, folder_fd in walk:  # deepest first, never through a link
        count, size = _clear_folder(folder_fd, subfolders, names)
        files, removed = files + count, removed + size
        if here != "." and os.listdir(folder_fd) == [NAMESPACE_FILE]:
            # A namespace's config.json goes with its last block file, from a folder that
            # holds nothing else (the folder itself goes when its parent is cleared).
            found = os.stat(NAMESPACE_FILE, dir_fd=folder_fd, follow_symlinks=False)
            if stat.S_ISREG(found.st_mode):
                os.unlink(NAMESPACE_FILE, dir_fd=folder_fd)
    return files, removed


def clear_tier(path: str) -> tuple[int, int]:
    """Empty the disk tier of ``path`` (kv_offload.disk_path); refused while a server uses
    it. Returns (files, bytes) removed."""
    if not path:
        raise Refused("kv_offload.disk_path", "empty: this config has no disk tier to clear")
    root = tier_root(path)
    try:
        root_fd = open_root(root)
    except FileNotFoundError:
        raise Refused("kv_offload.disk_path", f"{root} does not exist: nothing to clear") from None
    except OSError as exc:
        raise Refused("kv_offload.disk_path", f"cannot open {root}: {exc}") from None
    try:
        return _clear_locked(root, root_fd)
    finally:
        os.close(root_fd)


def _clear_locked(root: Path, root_fd: int) -> tuple[int, int]:
    try:
        lock_fd = _lock(root_fd)
    except BlockingIOError:
        raise Refused(
            "kv_offload.disk_path",
            f"a running server uses the disk tier at {root}; stop it first (`vllm-offload "
            "service stop` or the page's Stop), then clear",
        ) from None
    except OSError as exc:
        raise Refused(
            "kv_offload.disk_path",
            f"cannot lock {root}: {exc}; run this as the "
            "server's user, or as the manager's with install-service's grant",
        ) from None
    try:
        return clear(root_fd)
    except OSError as exc:
        raise Refused(
            "kv_offload.disk_path",
            f"cannot clear {root}: {exc.strerror}; run this as the server's user",
        ) from None
    finally:
        os.close(lock_fd)
