"""`vllm-offload patch status|apply|revert`: vllm-offload's diffs on the installed vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path

from vllm_offload.cli._common import UsageError
from vllm_offload.upstream import patching


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "patch",
        help="apply, revert or inspect vllm-offload's patches to vLLM",
        description="vllm-offload's changes to vLLM are a series of git format-patch files "
        "per release (vllm_offload/patches/vllm-X.Y.Z/); status lists them with their "
        "subjects. apply and revert are all-or-nothing and idempotent.",
    )
    parser.add_argument("action", choices=["status", "apply", "revert"])
    parser.add_argument(
        "--site",
        type=Path,
        help="site-packages directory holding vllm/ (default: the vLLM this Python imports)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    site = args.site.absolute() if args.site else patching.default_site()
    if not (site / "vllm").is_dir():
        raise UsageError(f"--site {site}: no vllm/ directory there")
    version = patching.site_version(site)
    if patching.recover(site):
        print(f"rolled back an interrupted patch operation in {site}")
    if args.action == "status":
        state = patching.status(site)
        print(f"vLLM {version} at {site}: {state.value}")
        for patch in patching.load_series(version).patches:
            print(f"  {patch.name}")
    elif args.action == "apply":
        changed = patching.apply(site)
        print(f"vLLM {version} at {site}: {'applied' if changed else 'already applied'}")
    else:
        changed = patching.revert(site)
        print(f"vLLM {version} at {site}: {'reverted' if changed else 'not applied'}")
    return 0
