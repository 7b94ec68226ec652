"""Combinations known to fail or to run badly with vLLM 0.32 (or with this host), each
refused as a problem or warned about, with where it comes from upstream. Each has a test
(tests/plan/test_fit.py, tests/vllm_ext/test_amx.py)."""

from __future__ import annotations

from vllm_offload.config import DeploymentConfig, flag_name
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.records import Backend, Notes, PlanInputs, Problem


def runs_bfloat16(config: DeploymentConfig, model: ModelFacts) -> bool:
    """Whether vLLM computes in bfloat16: asked for, or 'auto' on a checkpoint that is
    neither float16 nor float32 (vLLM keeps bfloat16 and downcasts float32 to it)."""
    if config.model.dtype != "auto":
        return config.model.dtype == "bfloat16"
    return model.torch_dtype not in ("float16", "half")


def combination_checks(inputs: PlanInputs, backend: Backend) -> Notes:
    """Combinations known to fail or to run badly with vLLM 0.32, each refused (a problem)
    or warned about with where it comes from upstream."""
    config, model, host = inputs.config, inputs.model, inputs.host
    platform, env = inputs.platform, inputs.env
    problems: list[Problem] = []
    warnings: list[str] = []
    if platform == "cpu" and host.amx == "refused" and runs_bfloat16(config, model):
        problems.append(
            {
                "field": "model.dtype",
                "message": f"{host.amx_detail}: vLLM's CPU attention runs AMX kernels in bfloat16 "
                "on such a CPU (v1/attention/backends/cpu_attn.py _get_attn_isa), and its worker "
                "would die with SIGILL on the first request; set model.dtype = 'float16' (vLLM's "
                "AVX-512 kernels), or give the machine a kernel that grants AMX (Linux 5.16+, AMX "
                "enabled for the VM)",
            }
        )
    used = config.parallel.ranks
    if platform == "cuda" and len(host.gpus) > used:
        # issue #56: `--gpu-count 2` planned one GPU without a word (one that fits none is split)
        warnings.append(
            f"{len(host.gpus)} GPUs here, and this model is planned on {used} of them "
            f"(parallel.tensor_parallel_size = {config.parallel.tensor_parallel_size}): set "
            f"it to {len(host.gpus)} to split the model over all of them, or serve more "
            "models ([[models]]: each is placed on a GPU of its own where one holds it)"
        )
    if backend != "none" and "expandable_segments:True" in env.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        problems.append(
            {
                "field": "PYTORCH_CUDA_ALLOC_CONF",
                "message": "vLLM refuses a KV connector (the CPU tier) with "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (config/vllm.py "
                "_verify_kv_transfer_compat, vllm-project/vllm#41237, #42404): remove it from "
                "the server's environment (the unit's EnvironmentFile) or set "
                "kv_offload.backend = none",
            }
        )
    if backend == "lmcache" and any(layer.kind == "linear" for layer in model.layers):
        problems.append(
            {
                "field": "kv_offload.backend",
                "message": "LMCache's connector does not support vLLM's hybrid KV cache manager, "
                "so vLLM turns it off, and a model with linear-attention (Mamba) layers then fails "
                "to start ('Failed to promote local KV cache specs', vllm-project/vllm#42911); use "
                "kv_offload.backend = native, which keeps it",
            }
        )
    if backend == "lmcache" and any(layer.kind == "sliding" for layer in model.layers):
        warnings.append(
            "with LMCache vLLM turns its hybrid KV cache manager off, so sliding-window layers "
            "keep every token (planned so here; vllm-project/vllm#41847); the native tier "
            "keeps the window"
        )
    drafting = any(flag_name(token) == "--speculative-config" for token in config.extra_args)
    if backend == "native" and drafting:
        warnings.append(
            "with a speculative drafter (EAGLE, MTP) the native tier leaves each prompt's "
            "last chunk out of storing and of hits (vLLM 0.32 offloading/scheduler.py, after "
            "vllm-project/vllm#46971 and #52735): up to kv_offload.cpu_chunk_tokens fewer "
            "tokens served per hit"
        )
    if host.wsl and env.get("VLLM_WSL2_ENABLE_PIN_MEMORY", "0") == "1":
        warnings.append(
            "WSL2: pinned memory is on (VLLM_WSL2_ENABLE_PIN_MEMORY=1); Windows caps it at "
            "about half the RAM given to WSL, so keep the CPU tier and offloaded weights below"
        )
    elif host.wsl:
        warnings.append(
            "WSL2: vLLM turns pinned memory off here unless VLLM_WSL2_ENABLE_PIN_MEMORY=1 (its "
            "platforms/cuda.py), so the CPU tier and weight offload copy from pageable "
            "memory, several times slower; set it in the server's environment"
        )
    return Notes(warnings=tuple(warnings), problems=tuple(problems))
