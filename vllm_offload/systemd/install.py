"""Install the files ``unit_files.render`` plans (the units, the polkit rule, the
environment file, a default config and the manager's token); uninstall removes exactly what
install added (it records that in a manifest).

``root`` places every file under a directory as if it were ``/``; paths *inside*
the files are the ones the service sees.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import tempfile
from pathlib import Path

from vllm_offload.safe_files import open_regular
from vllm_offload.systemd.disk_grant import grant_disk_tier
from vllm_offload.systemd.unit_files import (
    DEFAULT_STATE_DIR,
    InstallError,
    InstallOptions,
    checked_disk_path,
    config_of,
    render,
)

MANIFEST = "installed.json"


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to("/")


def _write(target: Path, content: str, mode: int, owner: str | None = None) -> None:
    """``target`` replaced by a file of ``content``: a temp file of a fresh name (O_EXCL:
    never through a link the services' users planted in the folders they own), its mode
    and owner set on the open file, then renamed over ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w") as file:
            file.write(content)
            os.fchmod(file.fileno(), mode)
            if owner and os.geteuid() == 0:
                entry = pwd.getpwnam(owner)
                os.fchown(file.fileno(), entry.pw_uid, entry.pw_gid)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _recorded(manifest_path: Path) -> list[str]:
    """What an earlier install recorded. The state directory is the server's user's, so
    the manifest counts only if this user wrote it (a regular file, not a link)."""
    try:
        with open_regular(manifest_path, follow_links=False) as file:
            if os.fstat(file.fileno()).st_uid != os.geteuid():
                raise InstallError(
                    f"{manifest_path}: not written by install-service (another "
                    "user owns it); check it, then remove it"
                )
            recorded = json.loads(file.read(1 << 20))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise InstallError(
            f"{manifest_path}: not install-service's manifest ({exc}); check it, then remove it"
        ) from None
    if not isinstance(recorded, list) or not all(isinstance(p, str) for p in recorded):
        raise InstallError(f"{manifest_path}: not install-service's manifest")
    return recorded


def install(options: InstallOptions) -> list[Path]:
    """Write the files under ``options.root``; returns those written (existing config,
    env and token are kept). Records them for uninstall."""
    files = render(options)
    config_dir = _under(options.root, options.config.parent)
    created_config_dir = not config_dir.exists()
    state_dir = _under(options.root, options.state_dir)
    manifest_path = state_dir / MANIFEST
    recorded = _recorded(manifest_path)
    written: list[Path] = []
    for planned in files:
        target = _under(options.root, planned.path)
        if planned.keep_existing and (target.exists() or target.is_symlink()):
            continue
        _write(target, planned.content, planned.mode, planned.owner)
        written.append(target)
    state_dir.mkdir(parents=True, exist_ok=True)
    if disk_path := checked_disk_path(config_of(options)):
        grant_disk_tier(_under(options.root, Path(disk_path)), options.user, options.manager_user)
    if os.geteuid() == 0:
        owner = pwd.getpwnam(options.user)
        os.chown(state_dir, owner.pw_uid, owner.pw_gid)
        if created_config_dir:  # the manager saves the config here (temp file + rename)
            manager = pwd.getpwnam(options.manager_user)
            os.chown(config_dir, manager.pw_uid, manager.pw_gid)
    all_files = sorted({*recorded, *(str(p.relative_to(options.root)) for p in written)})
    _write(manifest_path, json.dumps(all_files, indent=2), 0o644)
    if options.root == Path("/") and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
    return written


def uninstall(root: Path, state_dir: Path = DEFAULT_STATE_DIR) -> list[Path]:
    """Remove what install recorded (in a manifest this user wrote); returns the removed
    paths."""
    if not root.is_absolute():
        raise InstallError(f"--root {root}: must be an absolute path")
    manifest_path = _under(root, state_dir) / MANIFEST
    if not manifest_path.is_file():
        raise InstallError(f"{manifest_path}: not found; nothing was installed there")
    removed: list[Path] = []
    for rel in _recorded(manifest_path):
        target = root / rel
        if target.exists() or target.is_symlink():
            target.unlink()
            removed.append(target)
    manifest_path.unlink()
    removed.append(manifest_path)
    if root == Path("/") and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
    return removed
