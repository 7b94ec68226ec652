"""Options that several subcommands share: the config with flag overrides, and the host
facts (probed, or a declared machine)."""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vllm_offload import compat, hardware
from vllm_offload import config as config_mod
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import VllmOffloadError
from vllm_offload.vllm_version import InstalledVllm, VllmNotFound, find

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
        "exists, else built-in defaults",
    )
    for section, model in config_mod.SECTIONS.items():
        group = parser.add_argument_group(f"[{section}] overrides")
        for key, info in model.model_fields.items():
            if _is_table_list(info.annotation):  # [[cluster.boxes]]: in the file only
                continue
            dotted = f"{section}.{key}"
            flags = [f"--{section}-{key}".replace("_", "-")]
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


def say(message: str) -> None:
    print(f"vllm-offload: {message}", file=sys.stderr)
