"""Writing files into a site-packages directory that may be another user's (`patch
--site`, run as root on someone's venv). Every path is walked from the site's own fd one
folder at a time without following a link (O_NOFOLLOW), new files are made with O_EXCL
(never through a link planted at a name), and renames and removals are made relative to
the folder's fd: the site's owner cannot steer a write elsewhere, even by swapping a
folder for a link halfway."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path, PurePosixPath

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def parts(rel: str) -> tuple[str, ...]:
    """The components of a path relative to the site; ValueError for one that is absolute
    or climbs out ('..')."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"{rel!r} is not a path inside the site")
    return path.parts


def open_folder(site: Path, rel_folder: tuple[str, ...], *, create: bool) -> int:
    """A directory fd of ``site / rel_folder``, reached without following a link below
    ``site`` (the caller's own path, which may be one); folders made if ``create``."""
    fd = os.open(site, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in rel_folder:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_fd=fd)
            inner = os.open(name, _FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_new(folder: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """A new file ``name`` in ``folder`` (O_EXCL, O_NOFOLLOW), written and synced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=folder)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(site: Path, rel: str, data: bytes | None) -> None:
    """Write (a fresh temp file, then a rename) or delete ``site / rel``; a file it
    replaces keeps its mode."""
    *folder_parts, name = parts(rel)
    folder = open_folder(site, tuple(folder_parts), create=data is not None)
    try:
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder)  # unlink never follows a link
            return
        try:
            old = os.stat(name, dir_fd=folder, follow_symlinks=False)
            mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else 0o644
        except FileNotFoundError:
            mode = 0o644
        tmp = f".{name}.{secrets.token_hex(6)}.vllm-offload-tmp"
        write_new(folder, tmp, data, mode)
        try:
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(tmp, dir_fd=folder)
            raise
    finally:
        os.close(folder)
