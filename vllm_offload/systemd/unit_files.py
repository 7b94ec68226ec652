"""What install-service writes, rendered from its checked options: the systemd units, the
polkit rule, the environment file, a default config and the manager's token. Paths *inside*
the files are the ones the service sees."""

from __future__ import annotations

import grp
import importlib.resources
import os
import pwd
import re
import secrets
import shutil
import string
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_offload import cluster_router, disk_layout
from vllm_offload import config as config_mod
from vllm_offload.errors import VllmOffloadError
from vllm_offload.systemd.control import ServiceError, validate_unit

TEMPLATES = importlib.resources.files("vllm_offload.systemd") / "templates"  # package data
DEFAULT_STATE_DIR = Path("/var/lib/vllm-offload")
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


def checked_disk_path(config: config_mod.DeploymentConfig) -> str:
    """``kv_offload.disk_path`` ('' for none), refused where a unit cannot name it."""
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
    config = config_of(options)
    values = _template_values(options, config)

    def fill(name: str) -> str:
        return string.Template((TEMPLATES / name).read_text()).substitute(values)

    units = Path("/etc/systemd/system")
    files = [
        PlannedFile(path=units / f"{options.unit}.service", content=fill("vllm.service.in")),
        PlannedFile(
            path=units / f"{options.unit}-manager.service", content=fill("vllm-manager.service.in")
        ),
        PlannedFile(path=Path(values["env_file"]), content=ENV_FILE_TEXT, keep_existing=True),
        PlannedFile(
            path=Path(values["token_file"]),
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


def _template_values(
    options: InstallOptions, config: config_mod.DeploymentConfig
) -> dict[str, str]:
    """What the templates' ``$names`` stand for: the options, the paths the units read
    and write, and the router's command line."""
    config_dir = options.config.parent
    # Not in config_dir, which the manager's user owns (it saves the config there): the
    # server's environment (LD_PRELOAD, say) must be writable by root alone.
    env_file = Path("/etc/default") / f"{options.unit}-offload"
    disk_path = checked_disk_path(config)
    server_paths, manager_paths = _write_paths(options, disk_path)
    return {
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
        "token_file": str(config_dir / "manager-token"),
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


def _group(user: str) -> str:
    """``user``'s primary group; a user not made yet (a dry run): the group useradd
    would make, of the same name."""
    try:
        return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        return user
