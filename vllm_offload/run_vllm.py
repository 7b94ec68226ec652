"""Become vLLM's OpenAI server: vLLM's own classes read the spec first (the KV transfer
config, then the whole command line through ``argv_check``), then vLLM's server module
runs in this very process, exactly as ``python -m`` would: the PID stays the one systemd
started (its signals reach vLLM) and vLLM is imported once. An ``exec`` after validating
would import it twice (~10 s on a CPU host)."""

from __future__ import annotations

import os
import runpy
import sys

from vllm_offload import argv_check
from vllm_offload.launch_spec import LaunchSpec, PreflightError
from vllm_offload.model import real as real_model
from vllm_offload.upstream.version import SERVER_MODULE


def validate(spec: LaunchSpec) -> None:
    """Parse the KVTransferConfig with vLLM's own class, then the whole command line with
    vLLM's own parser (argv_check); imports vLLM: seconds."""
    if spec.kv_transfer_config is not None:
        from vllm.config import KVTransferConfig

        try:
            KVTransferConfig(**spec.kv_transfer_config)
        except Exception as exc:  # vLLM raises pydantic and plain ValueErrors alike
            raise PreflightError(
                "kv_offload", f"vLLM rejects the KV transfer config: {exc}"
            ) from exc
    argv_check.check(spec)


def enter_environment(spec: LaunchSpec) -> None:
    """This process's environment as vLLM reads it: the spec's variables, without our old
    VLLM_* name (vLLM warns of every VLLM_* name it does not know, on each start)."""
    os.environ.update(spec.env)
    os.environ.pop(real_model.OLD_CACHE_ENV, None)


def run(spec: LaunchSpec) -> None:
    """Become vLLM's OpenAI server: same process, same PID, as ``python -m`` does."""
    enter_environment(spec)
    validate(spec)
    sys.argv = [SERVER_MODULE, *spec.args]
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)
