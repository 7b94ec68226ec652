"""`vllm-offload manager`: the dashboard and control page (default 127.0.0.1:7999)."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

from vllm_offload import config as config_mod
from vllm_offload import preflight
from vllm_offload.cli._common import UsageError, port_taken
from vllm_offload.safe_files import open_regular
from vllm_offload.systemd.control import Systemd, validate_unit

# Open connections the manager serves at once; the unit's LimitNOFILE leaves room above.


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "manager",
        help="run the web manager (dashboard, control, settings, logs)",
        description="Serve the manager page and its JSON API (its schema at /openapi.json; "
        "no /docs page). It binds loopback unless a token file is given.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=7999)
    parser.add_argument("--token-file", type=Path, help="file holding the access token (0600)")
    parser.add_argument(
        "--config",
        type=Path,
        help=f"deployment config the manager shows and edits; default "
        f"{config_mod.DEFAULT_CONFIG_PATH} where it exists (install-service writes it), else "
        "~/.config/vllm-offload/config.toml, written with the defaults if missing (the one "
        "`serve` then reads without --config)",
    )
    parser.add_argument("--unit", default="vllm", help="server unit name (without .service)")
    parser.add_argument(
        "--systemd-root",
        type=Path,
        help="units live under this root (docker-systemctl-replacement)",
    )
    parser.set_defaults(handler=run)


def read_token(path: Path) -> str:
    """The token of a file only its owner may read or write (0600: install-service's)."""
    try:
        with open_regular(path) as file:
            mode = os.fstat(file.fileno()).st_mode & 0o777
            data = file.read(4096)
    except OSError as exc:
        raise UsageError(f"--token-file {path}: cannot read it ({exc})") from None
    if mode & 0o077:
        raise UsageError(
            f"--token-file {path}: other users can read or write it (mode {mode:o}), so "
            "they could learn or set the token; chmod 600 it"
        )
    token = data.decode(errors="replace").strip()
    if len(token) < 16:
        raise UsageError(f"--token-file {path}: the token must be at least 16 characters")
    return token


def config_path() -> Path:
    """The config the manager edits without --config: the system's or the user's where one
    exists, else the user's, written now with the defaults (issue #56: on a fresh machine
    `vllm-offload manager` as the README writes it failed on a missing /etc file)."""
    found = config_mod.default_path()
    if found is not None:
        return found
    path = config_mod.user_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    config_mod.save(config_mod.DeploymentConfig(), path)
    print(f"vllm-offload manager: wrote the default config to {path}", file=sys.stderr)
    return path


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    import uvicorn

    from vllm_offload import http_limits
    from vllm_offload.manager import ManagerSettings, create_app

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be 1-65535")
    validate_unit(args.unit)
    if args.token_file is None and not preflight.is_loopback(args.host):
        raise UsageError(
            f"--host {args.host}: refusing to listen beyond loopback without a token; pass "
            "--token-file (install-service writes one)"
        )
    args.config = args.config or config_path()
    config_mod.load(args.config)  # a missing or invalid config is an error now, not later
    if (busy := port_taken(args.host, args.port)) is not None:
        raise UsageError(f"--port: {busy}")
    if args.token_file is not None:
        token = read_token(args.token_file)
    else:
        token = secrets.token_urlsafe(24)
        print(
            f"vllm-offload manager: no --token-file; this run's token is {token}", file=sys.stderr
        )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"vllm-offload manager: http://{shown}:{args.port}/ (config {args.config})",
        file=sys.stderr,
    )
    settings = ManagerSettings(
        config_path=args.config,
        token=token,
        unit=args.unit,
        systemd=Systemd.detect(args.systemd_root),
        token_file=args.token_file,
    )
    # Bounded (http_limits.MANAGER): each request's head within 10 s, its body within 30 s,
    # at most 256 connections and 64 from one address; an idle keep-alive one closes after 5 s.
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_keep_alive=5,
        http=http_limits.protocol(http_limits.MANAGER),
    )
    return 0
