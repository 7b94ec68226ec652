"""`vllm-offload install-service`, `uninstall-service` and `service ACTION`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vllm_offload import config as config_mod
from vllm_offload.systemd import install, service_check, unit_files
from vllm_offload.systemd.control import ServiceError, Systemd


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    install_parser = subparsers.add_parser(
        "install-service",
        help="install the systemd units (server and manager), polkit rule, env file, token",
        description="Render the unit templates (vllm_offload/systemd/templates/) for this "
        "venv and install them. With --root, "
        "files go under DIR as if it were /; paths inside them are as the service sees them.",
    )
    install_parser.add_argument("--user", default="vllm-offload", help="user the server runs as")
    install_parser.add_argument(
        "--manager-user",
        default="",
        help="user the manager runs as (default: --user); it may start, stop and restart "
        "the server unit and nothing else",
    )
    install_parser.add_argument(
        "--unit", default="vllm", help="server unit name (without .service)"
    )
    install_parser.add_argument(
        "--config",
        type=Path,
        help="deployment config the units use (must exist; default "
        f"{config_mod.DEFAULT_CONFIG_PATH}, created with defaults if missing)",
    )
    install_parser.add_argument(
        "--state-dir",
        type=Path,
        default=unit_files.DEFAULT_STATE_DIR,
        help="the service's writable home (caches, install manifest)",
    )
    install_parser.add_argument(
        "--python", default=sys.executable, help="interpreter with vllm-offload"
    )
    install_parser.add_argument("--root", type=Path, default=Path("/"), help="install under DIR")
    install_parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print a summary (what the units point at, and whether the users can reach "
        "it: exit 2 where the install would be refused), then the files (the token "
        "withheld); write nothing; works before the users exist",
    )
    install_parser.set_defaults(handler=run_install)

    uninstall = subparsers.add_parser("uninstall-service", help="remove what install-service added")
    uninstall.add_argument("--root", type=Path, default=Path("/"))
    uninstall.add_argument("--state-dir", type=Path, default=unit_files.DEFAULT_STATE_DIR)
    uninstall.set_defaults(handler=run_uninstall)

    service = subparsers.add_parser("service", help="status/start/stop/restart/logs of the server")
    service.add_argument("action", choices=["status", "start", "stop", "restart", "logs"])
    service.add_argument("--unit", default="vllm")
    service.add_argument("--root", type=Path, help="docker-systemctl-replacement --root")
    service.add_argument("--lines", type=int, default=100, help="with logs")
    service.set_defaults(handler=run_service)


def run_install(args: argparse.Namespace, extra_args: list[str]) -> int:
    options = unit_files.validate(
        unit_files.InstallOptions(
            root=args.root,
            unit=args.unit,
            user=args.user,
            manager_user=args.manager_user,
            config=args.config or config_mod.DEFAULT_CONFIG_PATH,
            config_given=args.config is not None,
            state_dir=args.state_dir,
            python=args.python,
        )
    )
    refusals = service_check.refusals(options)
    if "root" in (options.user, options.manager_user):  # issue #56: accepted without a word
        print(
            "vllm-offload: warning: a unit runs as root: vLLM (and any code a model brings) "
            "or the manager's web API would have root's powers; a system user keeps them "
            "apart (sudo useradd --system --home /var/lib/vllm-offload vllm-offload)",
            file=sys.stderr,
        )
    if args.dry_run:
        print(summary(options, refusals))
        for planned in unit_files.render(options):
            print(f"=== {args.root / planned.path.relative_to('/')} (mode {planned.mode:o})")
            print(
                "(a new random token, kept if one exists; not shown)"
                if planned.secret
                else planned.content
            )
        return max((refusal.exit_code for refusal in refusals), default=0)
    if refusals:
        raise unit_files.InstallError("; and ".join(str(refusal) for refusal in refusals))
    for path in install.install(options):
        print(f"wrote {path}")
    if options.root != Path("/"):  # nothing here runs them: say where they are instead
        print(f"the units are under {options.root}; nothing was enabled")
        return 0
    print(f"next: systemctl enable --now {args.unit}.service {args.unit}-manager.service")
    return 0


def summary(options: unit_files.InstallOptions, refusals: list[unit_files.InstallError]) -> str:
    """What the dry run would install, what the units point at, and its verdict."""
    venv = Path(options.python).parent.parent
    lines = [
        "install-service --dry-run: nothing is written",
        f"  {options.unit}.service (the server) runs as {options.user}, "
        f"{options.unit}-manager.service as {options.manager_user}",
        f"  both run {options.python} (-> {os.path.realpath(options.python)}): they point into "
        f"{venv}; moving or deleting it breaks them (run install-service again after)",
        f"  config {options.config}, state {options.state_dir} (the server's HOME: a hub id "
        f"is read from {options.state_dir}/.cache/huggingface unless HF_HOME is set in "
        f"/etc/default/{options.unit}-offload)",
    ]
    if refusals:
        lines += [f"  would be refused: {refusal}" for refusal in refusals]
    else:
        lines.append(
            f"  checked: {options.user} and {options.manager_user} can run the "
            "interpreter and read the packages, config, model folders and tier "
            "folders"
        )
    return "\n".join(lines)


def run_uninstall(args: argparse.Namespace, extra_args: list[str]) -> int:
    for path in install.uninstall(args.root, args.state_dir):
        print(f"removed {path}")
    return 0


def not_installed(unit: str, systemd: Systemd) -> str:
    """Why a unit's status means nothing: it is not installed (and, where no systemd runs,
    which service manager was asked)."""
    where = (
        " (no systemd runs on this machine; docker-systemctl-replacement's systemctl3 "
        "answered for it)"
        if systemd.replacement
        else ""
    )
    return (
        f"{unit}.service is not installed{where}; `vllm-offload install-service` "
        "installs it, or pass --unit NAME for another unit"
    )


def run_service(args: argparse.Namespace, extra_args: list[str]) -> int:
    systemd = Systemd.detect(args.root)
    if args.action == "status":
        status = systemd.status(args.unit)
        if status.load_state == "not-found":
            raise ServiceError(not_installed(args.unit, systemd))
        print(
            f"{status.unit}.service: {status.active_state} ({status.sub_state}), "
            f"pid {status.main_pid or '-'}"
        )
    elif args.action == "logs":
        print("\n".join(systemd.logs(args.unit, args.lines)))
    else:
        getattr(systemd, args.action)(args.unit)
    return 0
