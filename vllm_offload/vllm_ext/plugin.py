"""vllm-offload's vLLM general plugin (entry point group ``vllm.general_plugins``), which
vLLM loads in each of its processes (API server, engine core, every worker) before it
runs a kernel."""

from __future__ import annotations

import logging
import os

from vllm_offload.vllm_ext import amx, start_phases
from vllm_offload.vllm_ext.knobs import SLEEP_ARENA_ENV, STAGED_PREFILL_ENV

logger = logging.getLogger("vllm_offload")

# vLLM's FlashAttention with staged prefill, by module path (imported only where it runs).
STAGED_BACKEND = "vllm_offload.vllm_ext.staged_attention.StagedFlashAttentionBackend"


def register() -> None:
    """Ask for AMX in this process where the CPU has it: vLLM's CPU attention runs AMX
    kernels without asking, and a worker that never asked dies with SIGILL (see amx.py).
    Harmless elsewhere: a GPU host's workers simply hold the permission unused."""
    start_phases.install()  # what a person sees while it starts
    found, why = amx.state(amx.read_cpuinfo(), amx.request_permission)
    if found == "refused":
        logger.warning("vllm-offload: %s; vLLM's bfloat16 CPU attention would die here", why)
    if os.environ.get(SLEEP_ARENA_ENV) == "1":  # an engine of several models, which sleeps
        from vllm_offload.vllm_ext import sleep

        sleep.register()
    if os.environ.get(STAGED_PREFILL_ENV) == "1":  # an engine with a host extension
        from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

        register_backend(AttentionBackendEnum.FLASH_ATTN, STAGED_BACKEND)
