#!/usr/bin/env python3
"""Issue #22, phase 1: can vLLM's own paged attention kernels read a KV pool whose high
blocks live in host RAM, and what does it cost?

One CUDA virtual range per layer's pool, its first blocks backed by GPU memory and the
rest by host memory (cuMemCreate with a host NUMA location: not managed memory), in the
block-major layout (block, K/V, token, kv head, dim), so a block table mixes GPU and host
blocks freely. For the Llama-3-8B shape (32 query heads, 8 KV heads, 128 dims, bf16):

1. correctness: vLLM's FlashAttention (FA3 and FA2, `vllm.vllm_flash_attn`) and its
   Triton unified attention on the mixed pool against the same call on an all-GPU copy
   (bit-identical expected) and a torch reference (bf16 tolerance), decode and a chunked
   prefill step;
2. cost: one layer's decode attention time against host-resident tokens (0, 8k, 32k,
   96k beside 16k on the GPU), the read rate it implies, and a 2,048-token prefill chunk;
3. the alternatives on the same box: CPU attention over RAM-resident KV (torch on the
   host's cores) and per-layer streaming of the host blocks to a GPU staging buffer
   (copy, then attention on the GPU).

Needs torch, cuda-bindings and the vLLM bundle (PYTHONPATH). Writes $OUT/mixed_pool.json.

    python3 benchmarks/long_context/mixed_pool.py
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from cuda.bindings import driver as cu

GIB = 1 << 30
Q_HEADS, KV_HEADS, DIM = 32, 8, 128
DTYPE = torch.bfloat16
GPU_TOKENS = 16384
HOST_TOKENS = (0, 8192, 32768, 98304)
PREFILL_CHUNK = 2048


def ok(result: Any) -> Any:
    error = result[0] if isinstance(result, tuple) else result
    if error != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(error))
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def allocation(kind: str) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = getattr(cu.CUmemLocationType, kind)
    prop.location.id = 0
    return prop


class MixedRange:
    """A virtual range: ``gpu_bytes`` of device memory, then ``host_bytes`` of host memory."""

    def __init__(self, gpu_bytes: int, host_bytes: int) -> None:
        device, host = (
            allocation("CU_MEM_LOCATION_TYPE_DEVICE"),
            allocation("CU_MEM_LOCATION_TYPE_HOST_NUMA"),
        )
        flag = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        grain = max(int(ok(cu.cuMemGetAllocationGranularity(p, flag))) for p in (device, host))
        self.gpu_bytes = -(-gpu_bytes // grain) * grain
        self.host_bytes = -(-host_bytes // grain) * grain
        self.size = self.gpu_bytes + self.host_bytes
        self.va = int(ok(cu.cuMemAddressReserve(self.size, 0, 0, 0)))
        self.handles = []
        for offset, nbytes, prop in (
            (0, self.gpu_bytes, device),
            (self.gpu_bytes, self.host_bytes, host),
        ):
            if nbytes:
                handle = ok(cu.cuMemCreate(nbytes, prop, 0))
                ok(cu.cuMemMap(self.va + offset, nbytes, 0, handle, 0))
                self.handles.append(handle)
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = 0
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(cu.cuMemSetAccess(self.va, self.size, [access], 1))

    def tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        numel = 1
        for n in shape:
            numel *= n
        assert numel * 2 <= self.size

        class Span:
            def __init__(self, address: int) -> None:
                data = (address, False)
                self.__cuda_array_interface__ = {
                    "shape": (numel,),
                    "typestr": "<i2",
                    "data": data,
                    "version": 3,
                }

        return torch.as_tensor(Span(self.va), device="cuda").view(DTYPE).view(shape)

    def close(self) -> None:
        ok(cu.cuMemUnmap(self.va, self.size))
        for handle in self.handles:
            ok(cu.cuMemRelease(handle))
        ok(cu.cuMemAddressFree(self.va, self.size))


def timed(call: Callable[[], Any], repeats: int = 10) -> float:
    call()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / repeats


def kernels(block: int) -> dict[str, Callable[..., torch.Tensor]]:
    """vLLM's paged attention entry points: (q, k_cache, v_cache, block_table, context
    lengths, query start offsets, longest query, longest context) -> output."""
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    def fa(version: int) -> Callable[..., torch.Tensor]:
        def run(q, k, v, table, lens, starts, max_q, max_k):
            return flash_attn_varlen_func(
                q,
                k,
                v,
                max_seqlen_q=max_q,
                cu_seqlens_q=starts,
                max_seqlen_k=max_k,
                seqused_k=lens,
                softmax_scale=DIM**-0.5,
                causal=True,
                block_table=table,
                fa_version=version,
            )

        return run

    def triton(q, k, v, table, lens, starts, max_q, max_k):
        out = torch.empty_like(q)
        unified_attention(
            q,
            k,
            v,
            out,
            starts,
            max_q,
            lens,
            max_k,
            DIM**-0.5,
            True,
            (-1, -1),
            table,
            0.0,
            None,
            None,
            None,
        )
        return out

    return {"FA3": fa(3), "FA2": fa(2), "Triton": triton}


def measure(
    run: Callable[..., torch.Tensor],
    mixed: tuple[torch.Tensor, torch.Tensor],
    all_gpu: tuple[torch.Tensor, torch.Tensor],
    want: torch.Tensor | None,
    *args: Any,
) -> dict[str, Any]:
    """One kernel on the mixed pool and on its all-GPU copy: equal? right? how fast?"""
    q, rest = args[0], args[1:]
    got, same = run(q, *mixed, *rest), run(q, *all_gpu, *rest)
    torch.cuda.synchronize()
    return {
        "bit_identical_to_all_gpu": bool(torch.equal(got, same)),
        "max_abs_diff_vs_reference": None
        if want is None
        else float((got.float() - want.float()).abs().max()),
        "ms_mixed": timed(lambda: run(q, *mixed, *rest)) * 1e3,
        "ms_all_gpu": timed(lambda: run(q, *all_gpu, *rest)) * 1e3,
    }


def cpu_attention_ms(k: torch.Tensor, v: torch.Tensor) -> float:
    """Alternative A: one decode query attended on the host's cores over RAM-resident KV."""
    ram_k, ram_v = k.cpu().transpose(0, 1)[None], v.cpu().transpose(0, 1)[None]
    q = torch.randn(1, Q_HEADS, 1, DIM, dtype=DTYPE)
    attend = torch.nn.functional.scaled_dot_product_attention
    attend(q, ram_k, ram_v, enable_gqa=True)
    began = time.perf_counter()
    for _ in range(3):
        attend(q, ram_k, ram_v, enable_gqa=True)
    return (time.perf_counter() - began) / 3 * 1e3


def stream_copy_ms(host_part: torch.Tensor) -> float:
    """Alternative B: copy the host blocks of one layer into a GPU staging buffer."""
    pinned = torch.empty(host_part.shape, dtype=DTYPE, pin_memory=True)
    staging = torch.empty_like(host_part, device="cuda")
    return timed(lambda: staging.copy_(pinned, non_blocking=True)) * 1e3


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: int) -> torch.Tensor:
    """Causal attention of the last len(q) positions of ``context`` tokens, in float32."""
    k = k.float().repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    v = v.float().repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * DIM**-0.5
    positions = torch.arange(context - q.shape[0], context, device=q.device)[:, None]
    scores.masked_fill_(torch.arange(context, device=q.device)[None] > positions, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(q.dtype)


def main() -> None:
    torch.manual_seed(0)
    torch.zeros(1, device="cuda")
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "shape": [Q_HEADS, KV_HEADS, DIM],
        "gpu_tokens": GPU_TOKENS,
    }
    for block in (16, 128):
        per_block = 2 * block * KV_HEADS * DIM * 2  # K and V, bf16
        rows: dict[str, Any] = {}
        out[f"block_{block}"] = rows
        for host_tokens in HOST_TOKENS:
            context = GPU_TOKENS + host_tokens
            blocks = context // block
            gpu_blocks = GPU_TOKENS // block
            pool = MixedRange(gpu_blocks * per_block, (blocks - gpu_blocks) * per_block)
            cache = pool.tensor((blocks, 2, block, KV_HEADS, DIM))  # block-major
            cache.copy_(torch.randn(cache.shape, dtype=DTYPE, device="cuda") * 0.5)
            on_gpu = cache.clone()  # the same bytes, all in device memory
            k, v = cache[:, 0], cache[:, 1]
            kd, vd = on_gpu[:, 0], on_gpu[:, 1]
            # a block table that interleaves GPU and host blocks
            order = torch.randperm(blocks, device="cuda", dtype=torch.int32)
            table = order[None]
            flat_k = k[order.long()].reshape(context, KV_HEADS, DIM)
            flat_v = v[order.long()].reshape(context, KV_HEADS, DIM)
            row: dict[str, Any] = {
                "context": context,
                "host_bytes_per_layer": (blocks - gpu_blocks) * per_block,
            }
            for name, query_len in (("decode", 1), ("prefill_chunk", PREFILL_CHUNK)):
                q = torch.randn(query_len, Q_HEADS, DIM, dtype=DTYPE, device="cuda") * 0.5
                lens = torch.tensor([context], dtype=torch.int32, device="cuda")
                starts = torch.tensor([0, query_len], dtype=torch.int32, device="cuda")
                want = reference(q, flat_k, flat_v, context) if host_tokens <= 32768 else None
                for kernel, run in kernels(block).items():
                    key = f"{name}/{kernel}"
                    try:
                        row[key] = measure(
                            run, (k, v), (kd, vd), want, q, table, lens, starts, query_len, context
                        )
                    except Exception as exc:  # a kernel that cannot: say which, go on
                        row[key] = {"error": repr(exc)[:400]}
                    print(block, host_tokens, key, row[key], flush=True)
            if host_tokens:
                row["decode/cpu_attention_ms"] = cpu_attention_ms(flat_k, flat_v)
                row["stream_copy_ms"] = stream_copy_ms(cache[gpu_blocks:])
                row["stream_copy_gb_per_s"] = (
                    row["host_bytes_per_layer"] / row["stream_copy_ms"] * 1e-6
                )
                mixed = row.get("decode/FA3", {})
                if "ms_mixed" not in mixed:
                    mixed = row.get("decode/Triton", {})
                if "ms_mixed" in mixed:
                    extra = mixed["ms_mixed"] - mixed["ms_all_gpu"]
                    row["decode_host_read_gb_per_s"] = row["host_bytes_per_layer"] / extra * 1e-6
                print(block, host_tokens, {x: row[x] for x in row if "/" not in x}, flush=True)
            del cache, on_gpu, k, v, kd, vd, flat_k, flat_v
            torch.cuda.synchronize()
            pool.close()
            rows[str(host_tokens)] = row
    if target := os.environ.get("OUT"):
        with open(f"{target}/mixed_pool.json", "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
