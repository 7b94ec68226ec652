"""What the manager's API may change in the config. Anything reachable through the API is
untrusted input, even with a valid token: a config written through it must not widen
the fence that confines it (the model roots, where the API key is read from, the
address the server listens on), nor pass vLLM a flag that runs code, reads or writes
files, or opens the server. Only an administrator, editing the file, can."""

from __future__ import annotations

import os

from vllm_offload.config import ConfigError, DeploymentConfig, flag_name
from vllm_offload.errors import Forbidden

# Config keys only the file may set. kv_offload.disk_path: the server writes there and
# `cache clear` deletes there.
FENCED_KEYS = ("manager.model_roots", "manager.api_extra_args", "server.host",
               "server.api_key_file", "kv_offload.disk_path")  # fmt: skip
# vLLM flags the API may pass in extra_args: tuning that loads no code, touches no path
# and opens nothing. Any other needs manager.api_extra_args in the file (or is there
# already, as the administrator wrote it).
TUNING_FLAGS = frozenset({
    "--enforce-eager", "--max-num-seqs", "--max-num-batched-tokens",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--no-enable-chunked-prefill", "--async-scheduling", "--no-async-scheduling",
    "--scheduling-policy", "--seed", "--max-logprobs", "--disable-log-stats",
    "--enable-log-requests", "--no-enable-log-requests", "--long-prefill-token-threshold",
    "--max-num-partial-prefills", "--disable-sliding-window", "--disable-custom-all-reduce",
    "--max-parallel-loading-workers", "--quantization", "-q", "--enable-expert-parallel",
})  # fmt: skip


def _value(config: DeploymentConfig, dotted: str) -> object:
    section, key = dotted.split(".")
    return getattr(getattr(config, section), key)


def check(saved: DeploymentConfig, new: DeploymentConfig) -> None:
    """Raise Forbidden (403) naming the field if ``new`` changes what only the file may;
    ConfigError (422) for a model path the manager and the server could resolve apart."""
    for dotted in FENCED_KEYS:
        if _value(new, dotted) != _value(saved, dotted):
            raise Forbidden(
                dotted,
                "only an administrator can change this, in the config file; the manager's "
                "API cannot",
            )
    path = new.model.path
    if path != saved.model.path and path and (path[0] != "/" or os.path.normpath(path) != path):
        # The manager and the server resolve a path each, as different users: '~' or a
        # relative one could name another folder for each.
        raise ConfigError(
            "model.path",
            "give an absolute path without '~', '.' or '..' parts (as the model list shows)",
        )
    allowed = (
        TUNING_FLAGS
        | {flag_name(t) for t in saved.extra_args}
        | {flag_name(t) for t in saved.manager.api_extra_args}
    )
    for token in new.extra_args:
        name = flag_name(token)
        if name is not None and name not in allowed:
            raise Forbidden(
                "extra_args",
                f"{token}: the manager's API may pass vLLM only tuning flags "
                f"({', '.join(sorted(TUNING_FLAGS))}); an administrator can allow more in "
                "the config file's manager.api_extra_args",
            )
