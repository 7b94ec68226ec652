"""Render and install the systemd units, the polkit rule, the
environment file, a default config and the manager's token; uninstall removes
exactly what install added (it records that in a manifest).

``root`` places every file under a directory as if it were ``/``; paths *inside*
the files are the ones the service sees.
"""

from __future__ import annotations

import grp
import importlib.resources
import json
import os
import pwd
import re
import secrets
import shutil
import string
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import cluster_router, disk_layout
from vllm_offload import config as config_mod
from vllm_offload.errors import VllmOffloadError
from vllm_offload.safe_files import open_regular
from vllm_offload.systemd.control import ServiceError, validate_unit

TEMPLATES = importlib.resources.files("vllm_offload.systemd") / "templates"  # package data
DEFAULT_STATE_DIR = Path("/var/lib/vllm-offload")
MANIFEST = "installed.json"
ENV_FILE_TEXT = """\
# Environment of the vllm-offload server (systemd EnvironmentFile): NAME=value, one a line.
# Not PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: vLLM 0.32 refuses it together with
# a KV connector (the CPU tier), so `vllm-offload serve` refuses it first and says so.
"""


class InstallError(VllmOffloadError):
    """Bad install input; names the option and the fix. Nothing has been written."""


@dataclass(frozen=True, kw_only=True)
class InstallOptions:
    root: Path = Path("/")
    unit: str = "vllm"
    user: str = "vllm-offload"
    manager_user: str = ""  # empty: the same as user
    config: Path = config_mod.DEFAULT_CONFIG_PATH
    config_given: bool = False
    state_dir: Path = DEFAULT_STATE_DIR
    python: str = sys.executable


@dataclass(frozen=True, kw_only=True)
class PlannedFile:
    path: Path  # as the service sees it
    content: str
    mode: int = 0o644
    owner: str | None = None  # chown to this user (when installing as root)
    keep_existing: bool = False  # config and token: never overwrite
    secret: bool = False  # the token: a dry run does not print it


def validate(options: InstallOptions) -> InstallOptions:
    """The options checked for shape (the users and what they can reach:
    ``service_check.refusals``)."""
    if not options.root.is_absolute():
        raise InstallError(f"--root {options.root}: must be an absolute path, e.g. /srv/image")
    try:
        validate_unit(options.unit)
    except ServiceError as exc:
        raise InstallError(f"--unit: {exc}") from None
    manager_user = options.manager_user or options.user
    for option, path in (("--config", options.config), ("--state-dir", options.state_dir)):
        if not path.is_absolute():
            raise InstallError(f"{option} {path}: must be an absolute path")
    if options.config_given and not options.config.is_file():
        raise InstallError(
            f"--config {options.config}: no such file; write one (vllm-offload config show "
            "> FILE) or leave --config out for the default"
        )
    if not os.access(options.python, os.X_OK):
        raise InstallError(f"--python {options.python}: not an executable")
    return InstallOptions(**{**options.__dict__, "manager_user": manager_user})


def _protect_home(paths: list[str]) -> str:
    # The venv's python often resolves into /root/.pyenv or /home/...: keep it readable.
    home_like = ("/home", "/root", "/run/user")
    resolved = [os.path.realpath(p) for p in paths]
    return "read-only" if any(p.startswith(home_like) for p in resolved) else "yes"


def config_of(options: InstallOptions) -> config_mod.DeploymentConfig:
    """The config the units will serve (defaults where none is given or it is unusable)."""
    if not options.config_given:
        return config_mod.DeploymentConfig()
    try:
        return config_mod.load(options.config)
    except config_mod.ConfigError:
        return config_mod.DeploymentConfig()


# What a path may hold to be written into a unit's ReadWritePaths= as it is (no spaces,
# quotes, backslashes or systemd's % specifiers).
UNIT_PATH = re.compile(r"/[A-Za-z0-9._/@+-]*")


def _disk_path(config: config_mod.DeploymentConfig) -> str:
    path = config.kv_offload.disk_path
    if path and not UNIT_PATH.fullmatch(path):
        raise InstallError(
            f"kv_offload.disk_path {path!r}: the units cannot name it; use a path of letters, "
            "digits and / . _ - + @"
        )
    return path


def _write_paths(options: InstallOptions, disk_path: str) -> tuple[str, str]:
    """ReadWritePaths= of the server's and the manager's unit: the state directory (and the
    config's for the manager), and exactly the disk tier's directory for the server, its
    folder (what "Clear disk tier" empties) for the manager. '-': a missing one is the
    planner's to report, not a mount failure."""
    server = str(options.state_dir)
    manager = f"{options.config.parent} {options.state_dir}"
    if disk_path:
        server += f" -{disk_path}"
        manager += f" -{disk_layout.tier_root(disk_path)}"
    return server, manager


def render(options: InstallOptions) -> list[PlannedFile]:
    """Every file install would write, with its content; pure apart from reading templates."""
    config_dir = options.config.parent
    token_file = config_dir / "manager-token"
    # Not in config_dir, which the manager's user owns (it saves the config there): the
    # server's environment (LD_PRELOAD, say) must be writable by root alone.
    env_file = Path("/etc/default") / f"{options.unit}-offload"
    config = config_of(options)
    disk_path = _disk_path(config)
    server_paths, manager_paths = _write_paths(options, disk_path)
    values = {
        "unit": options.unit,
        "user": options.user,
        "group": _group(options.user),
        "manager_user": options.manager_user,
        "manager_group": _group(options.manager_user),
        "python": options.python,
        "config": str(options.config),
        "config_dir": str(config_dir),
        "env_file": str(env_file),
        "state_dir": str(options.state_dir),
        "token_file": str(token_file),
        "systemctl": shutil.which("systemctl") or "/usr/bin/systemctl",
        "protect_home": _protect_home(
            [
                options.python,
                str(options.config),
                str(options.state_dir),
                config.model.path,
                disk_path,
            ]
        ),
        "server_write_paths": server_paths,
        "manager_write_paths": manager_paths,
        "router_exec": " ".join(
            cluster_router.command(
                options.python, options.config, Path(f"/run/{options.unit}-router/workers.json")
            )
        ),
    }

    def fill(name: str) -> str:
        return string.Template((TEMPLATES / name).read_text()).substitute(values)

    units = Path("/etc/systemd/system")
    files = [
        PlannedFile(path=units / f"{options.unit}.service", content=fill("vllm.service.in")),
        PlannedFile(
            path=units / f"{options.unit}-manager.service", content=fill("vllm-manager.service.in")
        ),
        PlannedFile(path=env_file, content=ENV_FILE_TEXT, keep_existing=True),
        PlannedFile(
            path=token_file,
            content=secrets.token_urlsafe(32) + "\n",
            mode=0o600,
            owner=options.manager_user,
            keep_existing=True,
            secret=True,
        ),
    ]
    if config.cluster.boxes:  # more than one box: this one also runs their router
        files.append(
            PlannedFile(
                path=units / f"{options.unit}-router.service",
                content=fill("vllm-router.service.in"),
            )
        )
    if not options.config_given:
        files.append(
            PlannedFile(
                path=options.config,
                content=config_mod.to_toml(config_mod.DeploymentConfig()),
                owner=options.manager_user,
                keep_existing=True,
            )
        )
    files.append(
        PlannedFile(
            path=Path(f"/etc/polkit-1/rules.d/50-{options.unit}-offload.rules"),
            content=fill("polkit.rules.in"),
        )
    )
    return files


def _group(user: str) -> str:
    """``user``'s primary group; a user not made yet (a dry run): the group useradd
    would make, of the same name."""
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return user


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
    if disk_path := _disk_path(config_of(options)):
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
