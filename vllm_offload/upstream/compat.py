"""The seed fork's names, in one place: what each became, and how an old setting is read
now. The seed ran vLLM with ``swap_space`` (a CPU swap area vLLM has since removed) and
sized its CPU tier in ``num_cpu_blocks``; its two entry points live on as ``tools/``
shims over ``vllm-offload serve`` and ``vllm-offload manager``."""

from __future__ import annotations

SWAP_SPACE_KEY = "swap_space"
SWAP_SPACE_FLAG = "--swap-space"
SWAP_SPACE_FIX = (
    "swap_space is gone from vLLM (removed upstream); the CPU tier for the KV cache is "
    "configured in [kv_offload]: set kv_offload.cpu_tier_gib (or leave it 'auto')"
)
SWAP_SPACE_FLAG_FIX = (
    "--swap-space: vLLM removed swap_space; the CPU tier for the KV cache is set with "
    "--kv-offload-cpu-tier-gib (config: kv_offload.cpu_tier_gib)"
)
# The seed counted the CPU tier in blocks of its block size: vLLM's 16 tokens unless the
# config set one.
SEED_BLOCK_TOKENS = 16


def tier_from_num_cpu_blocks(
    blocks: int, block_size: int | None, bytes_per_token: int, tensor_parallel_size: int
) -> tuple[int, str]:
    """kv_offload.num_cpu_blocks as bytes of CPU tier (all ranks), and the warning that
    says what to set instead. ``block_size``: the configured one, None for 'auto'."""
    tokens_per_block = block_size or SEED_BLOCK_TOKENS
    tier = blocks * bytes_per_token * tokens_per_block * tensor_parallel_size
    return tier, (
        f"kv_offload.num_cpu_blocks is deprecated: {blocks} blocks = {tier / (1 << 30):.2f} "
        f"GiB; set kv_offload.cpu_tier_gib = {tier / (1 << 30):.2f} instead"
    )
