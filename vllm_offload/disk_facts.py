"""The disk tier's directory as this host has it (kv_offload.disk_path): whether it exists
and may be written, its filesystem (RAM and network ones are told apart) and size, and
whether its files open with O_DIRECT. ``plan/disk.py`` judges the facts; this reads them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
from dataclasses import dataclass

import psutil

from vllm_offload.disk_layout import TIER_DIR

# Filesystems that are RAM (a disk tier there takes the RAM the CPU tier needs) and ones
# reached over the network (every KV read a round trip).
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs"})
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "fuse.sshfs",
        "9p",
        "lustre",
        "gpfs",
        "beegfs",
        "fuse.s3fs",
        "fuse.glusterfs",
        "afs",
    }
)


@dataclass(frozen=True, kw_only=True)
class DiskFacts:
    """The disk tier's directory as this host has it."""

    path: str
    exists: bool
    writable: bool
    filesystem: str  # the mount's type ('' unknown)
    total_bytes: int
    o_direct: bool | None  # None: not probed (missing or not writable)


def _filesystem(path: str) -> str:
    """The type of the mount holding ``path`` (the longest mount point above it)."""
    mounts = [
        p
        for p in psutil.disk_partitions(all=True)
        if path == p.mountpoint or path.startswith(p.mountpoint.rstrip("/") + "/")
    ]
    return max(mounts, key=lambda p: len(p.mountpoint)).fstype if mounts else ""


@functools.cache  # a filesystem keeps its answer; the manager plans every poll
def _o_direct(directory: str) -> bool:
    """Whether files in ``directory`` open with O_DIRECT: a probe file of a random name,
    made in the directory (by its fd) and never through a link (O_EXCL, O_NOFOLLOW: the
    server's user can plant one, and root runs this too), removed at once."""
    probe = f".vllm-offload-odirect-{secrets.token_hex(8)}"
    flags = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY | os.O_CLOEXEC
    try:
        folder = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fd = os.open(probe, flags | getattr(os, "O_DIRECT", 0), 0o600, dir_fd=folder)
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe, dir_fd=folder)
        return True
    except OSError:
        return False
    finally:
        os.close(folder)


def probe_disk(path: str) -> DiskFacts:
    """``path`` (kv_offload.disk_path) as this process finds it. Where the tier's folder is
    there already (install-service makes it, granting the manager's user that folder
    only), writable and O_DIRECT mean there: it is where the tier writes."""
    real = os.path.realpath(path)
    folder = os.path.join(real, TIER_DIR)
    if os.path.isdir(folder) and not os.path.islink(folder):
        real = folder
    exists = os.path.isdir(real)
    writable = exists and os.access(real, os.W_OK | os.X_OK)
    return DiskFacts(
        path=path,
        exists=exists,
        writable=writable,
        filesystem=_filesystem(real),
        total_bytes=shutil.disk_usage(real).total if exists else 0,
        o_direct=_o_direct(real) if writable else None,
    )
