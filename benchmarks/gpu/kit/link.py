"""The host link an experiment's model of time rests on: its measured rate, and the bytes
staged prefill copies over it."""

from __future__ import annotations

from kit.model import KV_BYTES_PER_TOKEN


def h2d_rate() -> float:
    """Bytes per second from pinned host RAM to the GPU (256 MiB, best of 5)."""
    import torch

    src = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    best = 0.0
    for _ in range(5):
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        dst.copy_(src, non_blocking=True)
        ended.record()
        torch.cuda.synchronize()
        best = max(best, src.numel() / (began.elapsed_time(ended) / 1000))
    return best


def staged_copy_bytes(
    long_tokens: int, gpu_tokens: int, chunk: int, kv_bytes_per_token: int = KV_BYTES_PER_TOKEN
) -> int:
    """Host bytes the staged prefill copies: each chunk, the host part of its context
    (its own tokens included), once per layer."""
    return sum(
        max(0, min(start + chunk, long_tokens) - gpu_tokens) * kv_bytes_per_token
        for start in range(0, long_tokens, chunk)
    )
