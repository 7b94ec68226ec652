"""vLLM flags and the config: which flags the launcher writes from which key (refused when
given by hand), which the launcher's entry point does not honour, and how vLLM's parser
reads a token's flag name."""

from __future__ import annotations

from vllm_offload.upstream import compat

# vLLM server flags the launcher writes from the config, and the key that owns each. Given
# again in extra_args (or after `serve --`), vLLM would keep the last value and serve
# something the planner never checked (a max_model_len the pool cannot hold hangs requests
# forever), so they are refused. Abbreviations count too: vLLM's parser takes
# `--max-model 8192` for --max-model-len.
LAUNCHER_FLAGS: dict[str, str] = {
    "--model": "model.path",
    "--served-model-name": "model.served_name",
    "--max-model-len": "model.max_model_len",
    "--dtype": "model.dtype",
    "--kv-cache-dtype": "model.kv_cache_dtype",
    "--gpu-memory-utilization": "gpu.memory_utilization",
    "--kv-cache-memory-bytes": "gpu.kv_cache_memory_bytes",
    "--num-gpu-blocks-override": "gpu.kv_cache_memory_bytes",
    "--block-size": "kv_offload.block_size",
    "--max-num-batched-tokens": "gpu.prefill_chunk_tokens",
    "--kv-transfer-config": "kv_offload",
    "--additional-config": "kv_offload.host_extension_gib",
    "--scheduler-cls": "kv_offload.spilled_step_share",
    "--kv-offloading-size": "kv_offload.cpu_tier_gib",
    "--kv-offloading-backend": "kv_offload.backend",
    "--cpu-offload-gb": "weights_offload.cpu_gib",
    "--cpu-offload-params": "weights_offload.params",
    "--offload-backend": "weights_offload.backend",
    "--offload-group-size": "weights_offload.cpu_gib",
    "--offload-num-in-group": "weights_offload.cpu_gib",
    "--offload-prefetch-step": "weights_offload.prefetch_step",
    "--offload-params": "weights_offload.params",
    "--tensor-parallel-size": "parallel.tensor_parallel_size",
    "-tp": "parallel.tensor_parallel_size",
    "--pipeline-parallel-size": "parallel.pipeline_parallel_size",
    "-pp": "parallel.pipeline_parallel_size",
    "--distributed-executor-backend": "parallel.distributed_executor_backend",
    "--host": "server.host",
    "--port": "server.port",
    "--api-key": "server.api_key_file",
    "--uds": "residency.runtime_dir",
    "--enable-sleep-mode": "residency.idle",
    "--enable-flashinfer-autotune": "server.reproducible",
    "--no-enable-flashinfer-autotune": "server.reproducible",
}
# Flags the server entry point the launcher runs does not honour (they belong to `vllm
# serve`'s multi-process front end), or that would read settings from elsewhere.
UNSUPPORTED_FLAGS: dict[str, str] = {
    "--api-server-count": "one API server process serves; vLLM's entry point that the "
    "launcher runs ignores it",
    "-asc": "one API server process serves; vLLM's entry point that the launcher runs ignores it",
    "--headless": "the launcher always runs the API server",
    "--config": "settings come from the deployment config; put them there (or in extra_args)",
    compat.SWAP_SPACE_FLAG: "swap_space is gone from vLLM; the CPU tier for the KV cache is "
    "set with kv_offload.cpu_tier_gib",
}


def flag_name(token: str) -> str | None:
    """The option a command-line token names, as vLLM's parser reads it (``--a_b=1`` and
    ``--a-b.key`` are ``--a-b``); None for a value."""
    if token.startswith("--") and len(token) > 2:
        return "--" + token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
    if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
        name = token.split("=", 1)[0]
        short = name.rstrip("0123456789")  # argparse reads -tp2 as -tp 2
        return short if short in LAUNCHER_FLAGS else name
    return None


def _matches(name: str, flags: dict[str, str]) -> str | None:
    """The flag of ``flags`` that vLLM's parser would take ``name`` for: the flag itself, or
    (argparse accepts any unambiguous prefix of a long option) one it begins."""
    if name in flags:
        return name
    if name.startswith("--") and len(name) > 3:
        return next((f for f in flags if f.startswith(name)), None)
    return None


def owning_key(token: str) -> str | None:
    """The config key that owns the vLLM flag ``token`` names (as vLLM's parser reads it),
    or None."""
    name = flag_name(token)
    owned = _matches(name, LAUNCHER_FLAGS) if name is not None else None
    return LAUNCHER_FLAGS[owned] if owned is not None else None


def key_flag(key: str) -> str:
    """The command-line flag of a config key (`model.max_model_len` -> --model-max-model-len)."""
    return "--" + key.replace(".", "-").replace("_", "-")


def refused_flag(token: str) -> str | None:
    """Why ``token`` may not be passed to vLLM by hand, or None if it may."""
    name = flag_name(token)
    if name is None:
        return None
    if (key := owning_key(token)) is not None:
        flag = key_flag(key)
        where = f"[{key}]" if "." not in key else f"{key} (`serve {flag}`)"
        return (
            f"{token} is written by vllm-offload from {where}; set that instead, so the "
            "planner checks it"
        )
    if (unsupported := _matches(name, UNSUPPORTED_FLAGS)) is not None:
        return f"{token} is not supported: {UNSUPPORTED_FLAGS[unsupported]}"
    return None
