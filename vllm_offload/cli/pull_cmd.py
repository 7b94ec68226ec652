"""`vllm-offload pull ID`: fetch a Hugging Face model into the HF cache, and nothing else."""

from __future__ import annotations

import argparse

from vllm_offload import deployment
from vllm_offload.cli import _common
from vllm_offload.config import ConfigError
from vllm_offload.errors import VllmOffloadError
from vllm_offload.model import hub


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "pull",
        help="download a Hugging Face model (org/name[@revision]) into the HF cache",
        description="Fetch a model's config, tokenizer and safetensors weights from the "
        "Hugging Face hub into the shared HF cache (HF_HUB_CACHE, default "
        "~/.cache/huggingface/hub) with huggingface_hub: a progress bar on the terminal, an "
        "interrupted download resumes, HF_TOKEN reads gated or private repos, HF_ENDPOINT "
        "names a mirror. Without ID: every hub id of the config. Then name the id as "
        "model.path (or --model, or a [[models]] path): `serve` uses the download and "
        "never fetches on start unless given --pull. Prints each model's folder.",
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="repo id: org/name[@revision]")
    parser.add_argument(
        "--config",
        default=None,
        help="with no ID: the config whose hub ids to fetch (as `serve --config`)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, extra_args: list[str]) -> int:
    refs = []
    for value in args.ids:
        ref = hub.hub_ref(value)
        if ref is None:
            raise ConfigError(
                "ID",
                f"{value!r} is not a repo id (org/name or "
                "org/name@revision), or names a folder here already",
            )
        refs.append(ref)
    if not args.ids:
        refs = deployment.hub_models(_common.effective_config(args, extra_args))
        if not refs:
            raise ConfigError(
                "model.path", "the config names no hub id; give one: `vllm-offload pull org/name`"
            )
    for ref in refs:
        try:
            print(hub.pull(ref))
        except VllmOffloadError as exc:  # about the id given here, not a config's model.path
            raise exc.named("ID" if args.ids else exc.field, exc.message) from None
    return 0
