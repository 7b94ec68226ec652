"""The disk tier's folder given to the server's user, and to another manager user through a
POSIX ACL, so that the manager's "Clear disk tier" can delete what the server wrote."""

from __future__ import annotations

import os
import pwd
import struct
from pathlib import Path

from vllm_offload import disk_layout
from vllm_offload.systemd.unit_files import InstallError

# A POSIX ACL as its extended attribute holds it (linux/posix_acl_xattr.h): a version,
# then (tag, permissions, id) entries in tag order.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_NO_ID = 0xFFFFFFFF


def _manager_acl(manager_uid: int) -> bytes:
    """Owner rwx, the manager's user rwx, the owner's group r-x, others nothing."""
    entries = [
        (_USER_OBJ, 7, _NO_ID),
        (_USER, 7, manager_uid),
        (_GROUP_OBJ, 5, _NO_ID),
        (_MASK, 7, _NO_ID),
        (_OTHER, 0, _NO_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *e) for e in entries)


def grant_disk_tier(disk_path: Path, user: str, manager_user: str) -> None:
    """The disk tier's folder in ``disk_path`` (made with it where missing): the server's
    user's, mode 0750; another manager user gets rwx on it and, as the default ACL, on
    everything the server makes in it (umask does not apply then), so that "Clear disk
    tier" can delete there. Nothing else is granted: ``disk_path`` stays as it is.
    Folders the server made before this grant keep their permissions."""
    disk_path.mkdir(parents=True, exist_ok=True)
    try:
        folder = disk_layout.open_root(disk_layout.tier_root(str(disk_path)), create=True)
    except OSError as exc:
        raise InstallError(
            f"kv_offload.disk_path: cannot prepare the tier's folder: {exc}"
        ) from None
    try:
        if os.geteuid() != 0:
            return  # only root may give it away; a --root image for a later install
        owner = pwd.getpwnam(user)
        os.fchown(folder, owner.pw_uid, owner.pw_gid)
        os.fchmod(folder, 0o750)
        if manager_user == user:
            return
        acl = _manager_acl(pwd.getpwnam(manager_user).pw_uid)
        try:
            os.setxattr(folder, "system.posix_acl_access", acl)
            os.setxattr(folder, "system.posix_acl_default", acl)
        except OSError as exc:
            raise InstallError(
                f"kv_offload.disk_path {disk_path}: its filesystem takes no POSIX ACL "
                f"({exc.strerror}), so {manager_user} could not clear the disk tier; mount it "
                "with ACLs, or run the manager as the server's user (--manager-user)"
            ) from None
    finally:
        os.close(folder)
