"""Whether another user can reach a file: every folder on the way searchable, the file
itself readable (or executable), by that user's uid and groups, walking the modes and
POSIX ACLs (the kernel's order: owner, named user, groups, other; the mask caps the
middle ones). install-service asks it for what the units' users will open: a venv whose
interpreter lives under root's 0700 home starts as 203/EXEC, a model folder the user
cannot read fails minutes into vLLM's start.

Root passes any read or search; to execute, some x bit must be set (as the kernel).
"""

from __future__ import annotations

import os
import pwd
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

READ, WRITE, EXECUTE = 4, 2, 1
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
MAX_FILES = 4096  # a folder's files looked at: a model's shards, a package's modules


@dataclass(frozen=True, kw_only=True)
class Who:
    name: str
    uid: int
    gids: frozenset[int]

    @classmethod
    def of(cls, name: str) -> Who:
        entry = pwd.getpwnam(name)
        return cls(name=name, uid=entry.pw_uid, gids=frozenset(os.getgrouplist(name, entry.pw_gid)))


def _acl(path: str) -> list[tuple[int, int, int]] | None:
    """The access ACL's (tag, permissions, id) entries, or None where it has none."""
    try:
        raw = os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return None
    return [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]


def _granted(path: str, info: os.stat_result, who: Who) -> int:
    """The permission bits (rwx as 4/2/1) ``who`` has on ``path``."""
    mode = info.st_mode
    if who.uid == info.st_uid:
        return (mode >> 6) & 7
    entries = _acl(path)
    if entries:
        mask = next((p for tag, p, _ in entries if tag == _MASK), 7)
        named = [p for tag, p, uid in entries if tag == _USER and uid == who.uid]
        if named:
            return named[0] & mask
        groups = [
            p
            for tag, p, gid in entries
            if (tag == _GROUP_OBJ and info.st_gid in who.gids)
            or (tag == _GROUP and gid in who.gids)
        ]
        if groups:
            best = 0
            for perms in groups:
                best |= perms
            return best & mask
        return mode & 7
    if info.st_gid in who.gids:
        return (mode >> 3) & 7
    return mode & 7


def _may(path: str, who: Who, want: int) -> bool:
    info = os.stat(path)
    if who.uid == 0:
        return not (want & EXECUTE and stat.S_ISREG(info.st_mode) and not info.st_mode & 0o111)
    return _granted(path, info, who) & want == want


def blocked(path: Path, who: Who, want: int) -> str | None:
    """Why ``who`` cannot open ``path`` for ``want`` (READ, EXECUTE, or both; links
    followed, every folder on the way and on the target's way searched), or None."""
    if not os.path.exists(path):
        return f"{path} does not exist"
    target = os.path.realpath(path)
    for folder in [*_folders(str(path)), *_folders(target)]:
        if not _may(folder, who, EXECUTE):
            return f"{who.name} cannot enter {folder} (mode {_mode(folder)})"
    if not _may(target, who, want):
        verb = "run" if want & EXECUTE and not os.path.isdir(target) else "read"
        return f"{who.name} cannot {verb} {target} (mode {_mode(target)})"
    return None


def blocked_folder(folder: Path, who: Who) -> str | None:
    """``blocked`` for a folder to list and every file directly in it to read."""
    if (why := blocked(folder, who, READ | EXECUTE)) is not None:
        return why
    for i, entry in enumerate(sorted(folder.iterdir())):
        if i >= MAX_FILES:
            break
        if entry.is_file() and (why := blocked(entry, who, READ)) is not None:
            return why
    return None


def _folders(path: str) -> list[str]:
    """The folders above ``path``, from '/' down."""
    return [str(p) for p in reversed(Path(path).parents)]


def _mode(path: str) -> str:
    info = os.stat(path)
    owner = _owner_name(info.st_uid)
    return f"{stat.S_IMODE(info.st_mode):o}, owner {owner}"


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
