"""Options that several subcommands share: the config with flag overrides, and the host
facts (probed, or a declared machine)."""

from __future__ import annotations

import argparse
import difflib
import os
import socket
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vllm_offload import config as config_mod
from vllm_offload import hardware
from vllm_offload.config import DeploymentConfig
from vllm_offload.config.flags import flag_name, key_flag, owning_key
from vllm_offload.errors import VllmOffloadError
from vllm_offload.upstream import compat
from vllm_offload.upstream.version import InstalledVllm, VllmNotFound, find

# Short spellings for the flags people type most.
ALIASES = {"model.path": "--model", "server.host": "--host", "server.port": "--port"}
_OVERRIDE_PREFIX = "set:"


class UsageError(VllmOffloadError):
    """Bad input on the command line; the message names the flag and the fix."""


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) is list


def _is_table_list(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    return (
        _is_list(annotation)
        and bool(args)
        and isinstance(args[0], type)
        and (issubclass(args[0], BaseModel))
    )


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        help=f"deployment config (TOML); default {config_mod.DEFAULT_CONFIG_PATH} if it "
        "exists, else ~/.config/vllm-offload/config.toml if it exists (what `vllm-offload "
        "manager` run by hand edits), else built-in defaults",
    )
    for section, model in config_mod.SECTIONS.items():
        group = parser.add_argument_group(f"[{section}] overrides")
        for key, info in model.model_fields.items():
            if _is_table_list(info.annotation):  # [[cluster.boxes]]: in the file only
                continue
            dotted = f"{section}.{key}"
            flags = [key_flag(dotted)]
            if dotted in ALIASES:
                flags.insert(0, ALIASES[dotted])
            group.add_argument(
                *flags,
                dest=_OVERRIDE_PREFIX + dotted,
                nargs="*" if _is_list(info.annotation) else None,
                metavar=key.upper(),
                # argparse formats help with %: a literal one in a description is %%.
                help=f"{(info.description or '').replace('%', '%%')} (config: {dotted})",
            )
    parser.add_argument(compat.SWAP_SPACE_FLAG, dest="swap_space", help=argparse.SUPPRESS)


# Subcommands that pass what follows `--` to vLLM as it is.
PASSES_TO_VLLM = ("serve", "plan")


def unknown_arguments(
    command: str, parser: argparse.ArgumentParser, unknown: list[str]
) -> UsageError:
    """What a token the command does not take was likely meant to be: a vLLM flag the
    launcher writes (its config key's flag), a misspelt option, or vLLM's own flag (which
    goes after `--`)."""
    token = next((t for t in unknown if t.startswith("-")), unknown[0])
    after = unknown[unknown.index(token) + 1 :]
    value = (
        token.split("=", 1)[1]
        if "=" in token
        else (after[0] if after and not after[0].startswith("-") else "")
    )
    name = flag_name(token) or token
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    if command in PASSES_TO_VLLM and (key := owning_key(token)) is not None:
        flag = key_flag(key)
        fix = (
            f"did you mean `{flag}{' ' + value if value else ''}`?"
            if flag in options
            else f"set the [{key}] keys in the config"
        )
        return UsageError(
            f"{name}: vLLM's flag; vllm-offload writes it from {key} (so the "
            f"planner checks it): {fix}"
        )
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.8)
    if close:
        return UsageError(f"{name}: no such option of `{command}`; did you mean `{close[0]}`?")
    if command in PASSES_TO_VLLM and token.startswith("--"):
        shown = token + (f" {value}" if value and "=" not in token else "")
        return UsageError(
            f"{name}: no such option of `{command}`; vLLM's own flags go after `--`: "
            f"`vllm-offload {command} -- {shown}` (or the config's extra_args)"
        )
    return UsageError(
        f"unrecognized arguments: {' '.join(unknown)} (see `vllm-offload {command} --help`)"
    )


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        name.removeprefix(_OVERRIDE_PREFIX): value
        for name, value in vars(args).items()
        if name.startswith(_OVERRIDE_PREFIX) and value is not None
    }


def effective_config(args: argparse.Namespace, extra_args: list[str]) -> DeploymentConfig:
    if getattr(args, "swap_space", None) is not None or compat.SWAP_SPACE_FLAG in extra_args:
        raise UsageError(compat.SWAP_SPACE_FLAG_FIX)
    config, _path = config_mod.load_default(args.config)
    overrides = _overrides(args)
    if extra_args:
        overrides["extra_args"] = [*config.extra_args, *extra_args]
    if overrides:
        config = config_mod.with_overrides(config, overrides)
    return config


def add_host_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpu-mem-gib",
        type=float,
        help="plan for a declared NVIDIA GPU of this size instead of probing this host",
    )
    parser.add_argument("--gpu-count", type=int, default=1, help="with --gpu-mem-gib: how many")
    parser.add_argument("--ram-gib", type=float, help="plan for this much host RAM")


def host_facts(args: argparse.Namespace) -> hardware.HostFacts:
    # NaN fails every comparison: `not 0 < x <= MAX` refuses it too.
    biggest = config_mod.MAX_GIB
    if args.gpu_mem_gib is not None and not 0 < args.gpu_mem_gib <= biggest:
        raise UsageError(
            f"--gpu-mem-gib: must be a positive number of GiB up to {biggest}, e.g. 24"
        )
    if not 1 <= args.gpu_count <= 64:
        raise UsageError("--gpu-count: must be 1 to 64")
    if args.ram_gib is not None and not 0 < args.ram_gib <= biggest:
        raise UsageError(f"--ram-gib: must be a positive number of GiB up to {biggest}")
    facts = hardware.probe()
    if declared(args):
        facts = hardware.declared(
            facts, gpu_mem_gib=args.gpu_mem_gib, gpu_count=args.gpu_count, ram_gib=args.ram_gib
        )
    return facts


def declared(args: argparse.Namespace) -> bool:
    """Whether the machine is declared (--gpu-mem-gib, --ram-gib): a plan for another host."""
    return args.gpu_mem_gib is not None or args.ram_gib is not None


def installed_vllm(required: bool) -> InstalledVllm | None:
    """The vLLM this Python imports; None where there is none and it is not ``required``
    (a GPU host's config inspected anywhere is planned for the pinned release)."""
    try:
        return find()
    except VllmNotFound:
        if required:
            raise
        return None


def port_taken(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, said before anything slow starts (vLLM
    found it after ~15 s of imports, uvicorn with a traceback), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return (
                f"{host}:{port} is taken ({exc.strerror}); stop what listens there "
                "(`ss -ltnp`) or choose another port"
            )
    return None


def say(message: str) -> None:
    print(f"vllm-offload: {message}", file=sys.stderr)


def add_control_options(parser: argparse.ArgumentParser) -> None:
    """Where a running front door of several models keeps its control socket."""
    default = config_mod.DEFAULT_CONFIG_PATH
    parser.add_argument("--config", type=Path, help=f"deployment config (TOML); default {default}")
    parser.add_argument(
        "--socket",
        type=Path,
        help="the front door's control socket (default: "
        "residency.runtime_dir's, else $RUNTIME_DIRECTORY's or "
        "$XDG_RUNTIME_DIR's, else the unit's /run/UNIT-offload)",
    )
    parser.add_argument("--unit", default="vllm", help="the server's systemd unit (default vllm)")


def control_socket(args: argparse.Namespace) -> tuple[DeploymentConfig, Path]:
    """The config and the control socket of its running front door; ServiceError where none
    is found."""
    from vllm_offload.box.prepare import control_socket as socket_of
    from vllm_offload.systemd.control import ServiceError

    config, _path = config_mod.load_default(args.config)
    if args.socket is not None:
        return config, args.socket
    here = socket_of(config, os.environ)
    unit = socket_of(config, {"RUNTIME_DIRECTORY": f"/run/{args.unit}-offload"})
    for candidate in (here, unit):
        if candidate.exists():
            return config, candidate
    alone = (
        "; this config names one model, which `serve` runs without a front door (always on the GPU)"
        if len(config.models) < 2
        else ""
    )
    raise ServiceError(
        f"no front door's control socket at {here} or {unit}: is `vllm-offload "
        f"serve` running with several [[models]]? --socket names it{alone}"
    )
