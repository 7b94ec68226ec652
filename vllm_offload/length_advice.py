"""Where a plan can start but is short for chat (issue #56: Qwen2.5-32B-AWQ on a 24 GB
card planned max_model_len 'auto' -> 2,176, exit 0, with only "long requests will
queue"): what would give a chat's length, each way planned for real (its decode ceiling
said), so that a person learns the trade before the first truncated conversation."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.deployment import model_dtype, plan_for
from vllm_offload.errors import VllmOffloadError
from vllm_offload.hardware import HostFacts
from vllm_offload.plan import Plan

# A conversation of a few turns with a system prompt: shorter is short for chat.
CHAT_TOKENS = 8192
WAYS = (
    ("weights_offload.cpu_gib = 'auto'", {"weights_offload.cpu_gib": "auto"}),
    ("model.kv_cache_dtype = 'fit'", {"model.kv_cache_dtype": "fit"}),
)


def short_for_chat(
    config: DeploymentConfig,
    plan: Plan,
    directory: Path,
    host: HostFacts,
    environ: Mapping[str, str],
) -> str | None:
    """A warning where 'auto' chose a length short of a chat's (and the model allows one),
    naming each setting that plans to it here; None otherwise."""
    wanted = min(CHAT_TOKENS, plan.length.model_max_tokens)
    if plan.platform != "cuda" or plan.length.source != "auto":
        return None
    if plan.length.max_model_len >= wanted:
        return None
    ways = []
    for said, overrides in WAYS:
        try:
            fixed = with_overrides(config, {**overrides, "model.max_model_len": wanted})
            other = plan_for(model_dtype(fixed, directory), directory, host, environ)
        except VllmOffloadError:
            continue  # that way does not reach it here
        if other.notes.problems:
            continue  # it plans, but could not start here
        ceiling = other.costs.decode_steps_per_s_ceiling
        ways.append(
            f"{said} ({ceiling:.0f} tokens/s at most: the offloaded weights cross PCIe every step)"
            if ceiling
            else said
        )
    gets = f"{' or '.join(ways)} gets {wanted:,}" if ways else "a larger GPU or a smaller model"
    return (
        f"max_model_len auto -> {plan.length.max_model_len:,} tokens is short for chat (a "
        f"few turns with a system prompt take ~{wanted:,}); {gets}"
    )
