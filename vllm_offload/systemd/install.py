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
import secrets
import shutil
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import config as config_mod
from vllm_offload.errors import VllmOffloadError
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


@dataclass(frozen=True)
class InstallOptions:
    root: Path = Path("/")
    unit: str = "vllm"
    user: str = "vllm-offload"
    manager_user: str = ""  # empty: the same as user
    config: Path = config_mod.DEFAULT_CONFIG_PATH
    config_given: bool = False
    state_dir: Path = DEFAULT_STATE_DIR
    python: str = sys.executable


@dataclass(frozen=True)
class PlannedFile:
    path: Path  # as the service sees it
    content: str
    mode: int = 0o644
    owner: str | None = None  # chown to this user (when installing as root)
    keep_existing: bool = False  # config and token: never overwrite


def _check_user(option: str, name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise InstallError(
            f"{option} {name!r}: no such user on this host; create it (e.g. `useradd --system "
            f"--home {DEFAULT_STATE_DIR} {name}`) or pass an existing one"
        ) from None


def validate(options: InstallOptions) -> InstallOptions:
    if not options.root.is_absolute():
        raise InstallError(f"--root {options.root}: must be an absolute path, e.g. /srv/image")
    try:
        validate_unit(options.unit)
    except ServiceError as exc:
        raise InstallError(f"--unit: {exc}") from None
    _check_user("--user", options.user)
    manager_user = options.manager_user or options.user
    _check_user("--manager-user", manager_user)
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


def _model_path(options: InstallOptions) -> str:
    try:
        return config_mod.load(options.config).model.path if options.config_given else ""
    except config_mod.ConfigError:
        return ""


def render(options: InstallOptions) -> list[PlannedFile]:
    """Every file install would write, with its content; pure apart from reading templates."""
    config_dir = options.config.parent
    token_file = config_dir / "manager-token"
    # Not in config_dir, which the manager's user owns (it saves the config there): the
    # server's environment (LD_PRELOAD, say) must be writable by root alone.
    env_file = Path("/etc/default") / f"{options.unit}-offload"
    values = {
        "unit": options.unit,
        "user": options.user,
        "group": grp.getgrgid(pwd.getpwnam(options.user).pw_gid).gr_name,
        "manager_user": options.manager_user,
        "manager_group": grp.getgrgid(pwd.getpwnam(options.manager_user).pw_gid).gr_name,
        "python": options.python,
        "config": str(options.config),
        "config_dir": str(config_dir),
        "env_file": str(env_file),
        "state_dir": str(options.state_dir),
        "token_file": str(token_file),
        "systemctl": shutil.which("systemctl") or "/usr/bin/systemctl",
        "protect_home": _protect_home(
            [options.python, str(options.config), str(options.state_dir), _model_path(options)]
        ),
    }

    def fill(name: str) -> str:
        return string.Template((TEMPLATES / name).read_text()).substitute(values)

    units = Path("/etc/systemd/system")
    files = [
        PlannedFile(units / f"{options.unit}.service", fill("vllm.service.in")),
        PlannedFile(units / f"{options.unit}-manager.service", fill("vllm-manager.service.in")),
        PlannedFile(env_file, ENV_FILE_TEXT, keep_existing=True),
        PlannedFile(
            token_file,
            secrets.token_urlsafe(32) + "\n",
            0o600,
            owner=options.manager_user,
            keep_existing=True,
        ),
    ]
    if not options.config_given:
        files.append(PlannedFile(options.config, config_mod.to_toml(config_mod.DeploymentConfig()),
                                 owner=options.manager_user, keep_existing=True))  # fmt: skip
    files.append(PlannedFile(Path(f"/etc/polkit-1/rules.d/50-{options.unit}-offload.rules"),
                             fill("polkit.rules.in")))  # fmt: skip
    return files


def _under(root: Path, path: Path) -> Path:
    return root / path.relative_to("/")


def install(options: InstallOptions) -> list[Path]:
    """Write the files under ``options.root``; returns those written (existing config,
    env and token are kept). Records them for uninstall."""
    files = render(options)
    config_dir = _under(options.root, options.config.parent)
    created_config_dir = not config_dir.exists()
    state_dir = _under(options.root, options.state_dir)
    manifest_path = state_dir / MANIFEST
    recorded: list[str] = json.loads(manifest_path.read_text()) if manifest_path.is_file() else []
    written: list[Path] = []
    for planned in files:
        target = _under(options.root, planned.path)
        if planned.keep_existing and target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(planned.content)
        os.chmod(tmp, planned.mode)
        if planned.owner and os.geteuid() == 0:
            entry = pwd.getpwnam(planned.owner)
            os.chown(tmp, entry.pw_uid, entry.pw_gid)
        os.replace(tmp, target)
        written.append(target)
    state_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        owner = pwd.getpwnam(options.user)
        os.chown(state_dir, owner.pw_uid, owner.pw_gid)
        if created_config_dir:  # the manager saves the config here (temp file + rename)
            manager = pwd.getpwnam(options.manager_user)
            os.chown(config_dir, manager.pw_uid, manager.pw_gid)
    all_files = sorted({*recorded, *(str(p.relative_to(options.root)) for p in written)})
    manifest_path.write_text(json.dumps(all_files, indent=2))
    if options.root == Path("/") and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
    return written


def uninstall(root: Path, state_dir: Path = DEFAULT_STATE_DIR) -> list[Path]:
    """Remove what install recorded; returns the removed paths."""
    if not root.is_absolute():
        raise InstallError(f"--root {root}: must be an absolute path")
    manifest_path = _under(root, state_dir) / MANIFEST
    if not manifest_path.is_file():
        raise InstallError(f"{manifest_path}: not found; nothing was installed there")
    removed: list[Path] = []
    for rel in json.loads(manifest_path.read_text()):
        target = root / rel
        if target.exists():
            target.unlink()
            removed.append(target)
    manifest_path.unlink()
    removed.append(manifest_path)
    if root == Path("/") and Path("/run/systemd/system").is_dir():
        subprocess.run(["systemctl", "daemon-reload"], check=True, timeout=60)
    return removed
