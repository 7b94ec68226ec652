"""What the manager's API may change in the config. Anything reachable through the API is
untrusted input, even with a valid token: a config written through it must not widen
the fence that confines it (the model roots, where the API key is read from, the
address the server listens on), nor pass vLLM a flag that runs code, reads or writes
files, or opens the server. Only an administrator, editing the file, can."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Set as AbstractSet

from vllm_offload.config import ClusterSection, ConfigError, DeploymentConfig, flag_name
from vllm_offload.config.schema import model_name
from vllm_offload.config.sections import ManagerSection
from vllm_offload.errors import Forbidden
from vllm_offload.model.hub import HubRef, shaped_like_id

# Config keys only the file may set: all of [manager] (its roots, the flags and hub ids the
# API may pass, and how it treats a wedged server), where the server listens and reads its
# key; kv_offload.disk_path: the server writes there and `cache clear` deletes there;
# residency.runtime_dir: the front door's control socket and the engines' sockets.
FENCED_KEYS = (
    *(f"manager.{key}" for key in ManagerSection.model_fields),
    "server.host",
    "server.api_key_file",
    "kv_offload.disk_path",
    "residency.runtime_dir",
    # cluster.*: where the router sends every request, and the key file it reads.
    *(f"cluster.{key}" for key in ClusterSection.model_fields),
)
ONLY_THE_FILE = (
    "only an administrator can change this, in the config file; the manager's API cannot"
)
# vLLM flags the API may pass in extra_args: tuning that loads no code, touches no path
# and opens nothing. Any other needs manager.api_extra_args in the file (or is there
# already, as the administrator wrote it).
TUNING_FLAGS = frozenset(
    {
        "--enforce-eager",
        "--max-num-seqs",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--async-scheduling",
        "--no-async-scheduling",
        "--scheduling-policy",
        "--seed",
        "--max-logprobs",
        "--disable-log-stats",
        "--enable-log-requests",
        "--no-enable-log-requests",
        "--long-prefill-token-threshold",
        "--max-num-partial-prefills",
        "--disable-sliding-window",
        "--disable-custom-all-reduce",
        "--max-parallel-loading-workers",
        "--quantization",
        "-q",
        "--enable-expert-parallel",
    }
)


def _value(config: DeploymentConfig, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def check(saved: DeploymentConfig, new: DeploymentConfig) -> None:
    """Raise Forbidden (403) naming the field if ``new`` changes what only the file may;
    ConfigError (422) for a model path the manager and the server could resolve apart."""
    for dotted in FENCED_KEYS:
        if _value(new, dotted) != _value(saved, dotted):
            raise Forbidden(dotted, ONLY_THE_FILE)
    hub_models = saved.manager.hub_models
    _plain_path("model.path", new.model.path, saved.model.path, hub_models)
    allowed = (
        TUNING_FLAGS
        | {flag_name(t) for t in saved.extra_args}
        | {flag_name(t) for t in saved.manager.api_extra_args}
    )
    _tuning_only("extra_args", new.extra_args, allowed)
    before = {model_name(entry): entry for entry in saved.models}
    for i, entry in enumerate(new.models):  # several models: each entry is fenced the same
        old = before.get(model_name(entry))
        if entry.kv_offload.get("disk_path") != (old.kv_offload.get("disk_path") if old else None):
            raise Forbidden(f"models[{i}].kv_offload.disk_path", ONLY_THE_FILE)
        _plain_path(f"models[{i}].path", entry.path, old.path if old else "", hub_models)
        own = {flag_name(t) for t in old.extra_args} if old else set()
        _tuning_only(f"models[{i}].extra_args", entry.extra_args, allowed | own)


def _plain_path(field: str, path: str, saved: str, hub_models: list[str]) -> None:
    """The manager and the server resolve a path each, as different users: '~' or a
    relative one could name another folder for each. A hub id only as the file allows."""
    if path != saved and shaped_like_id(path):
        hub_model(field, path, hub_models)
        return
    if path != saved and path and (path[0] != "/" or os.path.normpath(path) != path):
        raise ConfigError(
            field, "give an absolute path without '~', '.' or '..' parts (as the model list shows)"
        )


def allowed(value: str, hub_models: list[str]) -> bool:
    """Whether manager.hub_models lets the API name ``value`` (org/name[@revision]): a
    pattern without a revision allows the default branch only (issue #55: any revision of
    a listed repo was fetched, a pull-request ref anyone can open among them)."""
    repo, _, revision = value.partition("@")
    for pattern in hub_models:
        repo_pattern, _, revision_pattern = pattern.partition("@")
        if not fnmatch.fnmatchcase(repo, repo_pattern):
            continue
        if revision_pattern and revision:
            if fnmatch.fnmatchcase(revision, revision_pattern):
                return True
        elif not revision_pattern and not revision:
            return True
    return False


def hub_model(field: str, value: str, hub_models: list[str]) -> HubRef:
    """``value`` as a hub id the file's manager.hub_models lets the API name (and fetch);
    else ConfigError (not an id) or Forbidden (an id the file does not allow)."""
    if not shaped_like_id(value):
        raise ConfigError(
            field, f"{value[:200]!r} is not a Hugging Face repo id (org/name or org/name@revision)"
        )
    repo, _, revision = value.partition("@")
    if not allowed(value, hub_models):
        raise Forbidden(
            field,
            f"{value}: a Hugging Face id through the API downloads at a "
            "client's word; the config file's manager.hub_models lists the ids "
            f"it may name ({', '.join(hub_models) or 'none'}; a revision only where an "
            "entry names it: org/name@revision); or an "
            f"administrator fetches it (`vllm-offload pull {value}`) and names it "
            "in the file",
        )
    return HubRef(repo_id=repo, revision=revision or None)


def _tuning_only(field: str, tokens: list[str], allowed: AbstractSet[str | None]) -> None:
    for token in tokens:
        name = flag_name(token)
        if name is not None and name not in allowed:
            raise Forbidden(
                field,
                f"{token}: the manager's API may pass vLLM only tuning flags "
                f"({', '.join(sorted(TUNING_FLAGS))}); an administrator can allow more in "
                "the config file's manager.api_extra_args",
            )
