#!/usr/bin/env python3
"""Issue #41, the probe: staged prefill of one request longer than the GPU pool, in torch
alone (no vLLM), for the Llama-3-8B shape (32 query heads, 8 KV heads, 128 dims, bf16,
hidden 4096, MLP 14336): a 65,536-token prompt of which the GPU pool holds the first
16,384 tokens (2 GiB for 32 layers) and the rest lives in pinned host RAM.

Each layer's KV is one CUDA virtual range: its own GPU pages for the GPU part, then a
*scratch* part whose virtual pages in every layer map the same physical buffer (buffer
``layer % buffers``: cuMemMap of one handle at many addresses), so 32 layers time-share
one or two buffers of one layer's spill (vllm-ascend#12852's layer-wise buffer reuse,
and the design in docs/design/long-context.md, "staged prefill"). Per layer of a prefill
chunk, a side stream copies the host part of the chunk's past context into the layer's
scratch once, as soon as the layer that last used that buffer has attended; the chunk's
own K/V beyond the GPU part are written to the scratch (and to host RAM, for later
chunks); the attention kernel (FlashAttention 2 through torch, lower-right causal) reads
one contiguous K/V range as if it were all on the GPU.

1. one layer, the last chunk: attention on the all-GPU cache, on the staged scratch (copy
   then attend) and in place on a range whose host part is host memory mapped into the
   GPU (today's patch 0006 path): time and bit-identity;
2. a stack of 32 layers (QKV, attention, O, MLP with random weights of std 0.02) over the
   whole chunk schedule, for chunk sizes 2,048 / 8,192 / 16,384 and arms: all-GPU;
   staged with the copy overlapped, 2 buffers and 1 buffer; staged with the copy on the
   compute stream (serial). Per-chunk times, the TTFT model (their sum), the copy bytes
   and the floor: all-GPU TTFT + H2D bytes / the measured copy rate. Exactness: every
   chunk's output bit-identical to the all-GPU arm's, and a control (one spilled token of
   the prompt changed) that must change it.

Needs torch and cuda-bindings (both on the GPU host). Writes
$OUT/staged_prefill_probe_<context>.json. PROBE_CONTEXT (65536), PROBE_CHUNKS
(8192,16384,2048), PROBE_REPEATS, PROBE_ONE_LAYER=0 (skip section 1) and PROBE_BUDGET_S
(no new chunk size after it) change the run.

    python3 benchmarks/long_context/staged_prefill_probe.py
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from cuda.bindings import driver as cu

Q_HEADS, KV_HEADS, DIM, HIDDEN, MLP = 32, 8, 128, 4096, 14336
LAYERS = 32
DTYPE = torch.bfloat16
CONTEXT = int(os.environ.get("PROBE_CONTEXT", "65536"))
GPU_TOKENS = 16384  # 2 GiB of KV for 32 layers: the GPU pool's part of the request
SPILLED = CONTEXT - GPU_TOKENS
TOKEN_BYTES = KV_HEADS * DIM * 2  # K or V, one token, one layer
CHUNKS = tuple(int(c) for c in os.environ.get("PROBE_CHUNKS", "8192,16384,2048").split(","))
REPEATS = {8192: 3, 16384: 2, 2048: 2} | {  # PROBE_REPEATS: the same count for every size
    c: int(os.environ["PROBE_REPEATS"]) for c in CHUNKS if "PROBE_REPEATS" in os.environ
}
TIME_BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "300"))
STARTED = time.perf_counter()


def ok(result: Any) -> Any:
    error = result[0] if isinstance(result, tuple) else result
    if error != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(error))
    return result[1] if isinstance(result, tuple) and len(result) == 2 else result


def prop(kind: str) -> Any:
    p = cu.CUmemAllocationProp()
    p.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.location.type = getattr(cu.CUmemLocationType, kind)
    p.location.id = 0
    return p


DEVICE, HOST = prop("CU_MEM_LOCATION_TYPE_DEVICE"), prop("CU_MEM_LOCATION_TYPE_HOST_NUMA")


def create(nbytes: int, on_host: bool = False) -> Any:
    return ok(cu.cuMemCreate(nbytes, HOST if on_host else DEVICE, 0))


class Range:
    """One virtual range made of (handle, bytes) pieces mapped back to back; the same
    handle may appear in many ranges (aliasing)."""

    def __init__(self, pieces: list[tuple[Any, int]]) -> None:
        self.size = sum(n for _, n in pieces)
        self.va = int(ok(cu.cuMemAddressReserve(self.size, 2 << 20, 0, 0)))
        at = 0
        for handle, nbytes in pieces:
            ok(cu.cuMemMap(self.va + at, nbytes, 0, handle, 0))
            at += nbytes
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = 0
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        ok(cu.cuMemSetAccess(self.va, self.size, [access], 1))

    def tokens(self, offset: int, count: int) -> torch.Tensor:
        """``count`` tokens of K or V, (tokens, kv heads, dim), at byte ``offset``."""
        return (
            torch.as_tensor(_Span(self.va + offset, count * KV_HEADS * DIM), device="cuda")
            .view(DTYPE)
            .view(count, KV_HEADS, DIM)
        )


class _Span:
    """``numel`` 2-byte elements of device-visible memory at ``address``, for torch."""

    def __init__(self, address: int, numel: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (numel,),
            "typestr": "<i2",
            "data": (address, False),
            "version": 3,
        }


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """FlashAttention 2 (torch's), grouped heads, causal aligned to the last key (a chunk
    of queries at the end of its context): q (C, 32, 128), k/v (ctx, 8, 128)."""
    out = torch.ops.aten._scaled_dot_product_flash_attention(
        q.unsqueeze(0).transpose(1, 2),
        k.unsqueeze(0).transpose(1, 2),
        v.unsqueeze(0).transpose(1, 2),
        0.0,
        is_causal=True,
        scale=DIM**-0.5,
    )[0]
    return out.transpose(1, 2)[0]


def attend_check() -> float:
    """The kernel call against float32 math on a small case: grouped heads and the causal
    mask aligned to the last key (the chunk is the end of its context)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(64, Q_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    k = torch.randn(200, KV_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    v = torch.randn(200, KV_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    kf = k.float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
    vf = v.float().repeat_interleave(Q_HEADS // KV_HEADS, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * DIM**-0.5
    rows = torch.arange(200 - 64, 200, device="cuda")[:, None]
    scores.masked_fill_(torch.arange(200, device="cuda")[None] > rows, float("-inf"))
    want = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf)
    return float((attend(q, k, v).float() - want).abs().max())


class Weights:
    """One layer's weights (std 0.02), shared by all layers: the work between attentions."""

    def __init__(self) -> None:
        g = torch.Generator(device="cuda").manual_seed(1)

        def w(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, device="cuda", dtype=DTYPE, generator=g) * 0.02

        self.qkv = w(HIDDEN, (Q_HEADS + 2 * KV_HEADS) * DIM)
        self.o, self.gate_up, self.down = w(HIDDEN, HIDDEN), w(HIDDEN, 2 * MLP), w(MLP, HIDDEN)

    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.nn.functional.rms_norm(h, (HIDDEN,))
        qkv = x @ self.qkv
        q, k, v = qkv.split([Q_HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)
        n = h.shape[0]
        return q.view(n, Q_HEADS, DIM), k.reshape(n, KV_HEADS, DIM), v.reshape(n, KV_HEADS, DIM)

    def finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + attn.reshape(h.shape[0], HIDDEN) @ self.o
        gate, up = (torch.nn.functional.rms_norm(h, (HIDDEN,)) @ self.gate_up).chunk(2, -1)
        return h + (torch.nn.functional.silu(gate) * up) @ self.down


class AllGpu:
    """The reference: every layer's whole context in GPU memory."""

    name = "all_gpu"

    def __init__(self) -> None:
        self.k = [
            torch.empty(CONTEXT, KV_HEADS, DIM, dtype=DTYPE, device="cuda") for _ in range(LAYERS)
        ]
        self.v = [torch.empty_like(t) for t in self.k]

    def layer(
        self, layer: int, start: int, k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor
    ) -> torch.Tensor:
        end = start + k_new.shape[0]
        self.k[layer][start:end], self.v[layer][start:end] = k_new, v_new
        return attend(q, self.k[layer][:end], self.v[layer][:end])

    def chunk_done(self) -> None:
        pass


class Backing:
    """What the staged arms share (they run one after another and write the same bytes):
    each layer's GPU pages for K and V, and the spilled part in pinned host RAM."""

    def __init__(self) -> None:
        gpu_bytes = GPU_TOKENS * TOKEN_BYTES
        self.gpu = [(create(gpu_bytes), create(gpu_bytes)) for _ in range(LAYERS)]
        self.host_k = [
            torch.empty(SPILLED, KV_HEADS, DIM, dtype=DTYPE, pin_memory=True) for _ in range(LAYERS)
        ]
        self.host_v = [torch.empty_like(t, pin_memory=True) for t in self.host_k]


class Staged:
    """Per layer: its GPU part, then ``buffers`` scratch buffers of one layer's spill
    that every layer's range maps after its GPU part (layer % buffers), the spilled part
    in host RAM. ``overlap``: the H2D copy on a side stream, started when the buffer is
    free; else on the compute stream right before the attention."""

    def __init__(self, backing: Backing, buffers: int, overlap: bool) -> None:
        self.name = f"staged_{buffers}buf_{'overlap' if overlap else 'serial'}"
        self.buffers, self.overlap = buffers, overlap
        gpu_bytes, spill_bytes = GPU_TOKENS * TOKEN_BYTES, SPILLED * TOKEN_BYTES
        scratch = [(create(spill_bytes), create(spill_bytes)) for _ in range(buffers)]
        self.ranges = []
        for layer, (gk, gv) in enumerate(backing.gpu):
            sk, sv = scratch[layer % buffers]
            self.ranges.append(
                Range([(gk, gpu_bytes), (sk, spill_bytes), (gv, gpu_bytes), (sv, spill_bytes)])
            )
        self.k = [r.tokens(0, CONTEXT) for r in self.ranges]
        self.v = [r.tokens(CONTEXT * TOKEN_BYTES, CONTEXT) for r in self.ranges]
        self.host_k, self.host_v = backing.host_k, backing.host_v
        self.copy_stream, self.write_stream = torch.cuda.Stream(), torch.cuda.Stream()
        self.copied = [torch.cuda.Event() for _ in range(LAYERS)]
        self.freed = [torch.cuda.Event() for _ in range(LAYERS)]  # its buffer read
        self.pending: list[torch.Tensor] = []  # writes to host RAM in flight
        self.start = 0

    def begin_chunk(self, start: int) -> None:
        """Before a chunk's layer 0: queue the copies of the layers whose buffer is free."""
        self.start = start
        if self.overlap:
            for layer in range(min(self.buffers, LAYERS)):
                self._copy(layer)

    def _copy(self, layer: int) -> None:
        """The host part of the chunk's past context into this layer's scratch."""
        past = max(0, self.start - GPU_TOKENS)
        stream = self.copy_stream if self.overlap else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            if self.overlap and layer >= self.buffers:
                stream.wait_event(self.freed[layer - self.buffers])
            if past:
                self.k[layer][GPU_TOKENS : GPU_TOKENS + past].copy_(
                    self.host_k[layer][:past], non_blocking=True
                )
                self.v[layer][GPU_TOKENS : GPU_TOKENS + past].copy_(
                    self.host_v[layer][:past], non_blocking=True
                )
            self.copied[layer].record(stream)

    def layer(
        self, layer: int, start: int, k_new: torch.Tensor, v_new: torch.Tensor, q: torch.Tensor
    ) -> torch.Tensor:
        end = start + k_new.shape[0]
        main = torch.cuda.current_stream()
        if not self.overlap:
            self._copy(layer)
        main.wait_event(self.copied[layer])
        self.k[layer][start:end], self.v[layer][start:end] = k_new, v_new  # GPU part or scratch
        spilled_from = max(start, GPU_TOKENS)
        if end > spilled_from:  # the chunk's own spilled K/V also go to host RAM, for later
            wrote = torch.cuda.Event()
            wrote.record(main)
            with torch.cuda.stream(self.write_stream):
                self.write_stream.wait_event(wrote)
                at, to = spilled_from - GPU_TOKENS, end - GPU_TOKENS
                self.host_k[layer][at:to].copy_(k_new[spilled_from - start :], non_blocking=True)
                self.host_v[layer][at:to].copy_(v_new[spilled_from - start :], non_blocking=True)
            self.pending += [k_new, v_new]
        out = attend(q, self.k[layer][:end], self.v[layer][:end])
        self.freed[layer].record(main)
        if self.overlap and layer + self.buffers < LAYERS:
            self._copy(layer + self.buffers)
        return out

    def chunk_done(self) -> None:
        torch.cuda.current_stream().wait_stream(self.write_stream)
        self.pending.clear()


def h2d_tokens(chunk: int) -> int:
    """Spilled tokens copied host->GPU per layer over the whole schedule: each chunk's
    past context beyond the GPU part, once."""
    return sum(max(0, start - GPU_TOKENS) for start in range(0, CONTEXT, chunk))


def prefill(
    arm: Any, weights: Weights, prompt: torch.Tensor, chunk: int
) -> tuple[list[float], list[torch.Tensor]]:
    """The whole chunk schedule through 32 layers: per-chunk ms and each chunk's output."""
    times, outputs = [], []
    for start in range(0, CONTEXT, chunk):
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        if isinstance(arm, Staged):
            arm.begin_chunk(start)
        h = prompt[start : start + chunk]
        for layer in range(LAYERS):
            q, k, v = weights.project(h)
            h = weights.finish(h, arm.layer(layer, start, k.contiguous(), v.contiguous(), q))
        arm.chunk_done()
        ended.record()
        outputs.append(h.clone())
        torch.cuda.synchronize()
        times.append(began.elapsed_time(ended))
    return times, outputs


def copy_rate(nbytes: int) -> dict[str, float]:
    src = torch.empty(nbytes // 2, dtype=DTYPE, pin_memory=True)
    dst = torch.empty(nbytes // 2, dtype=DTYPE, device="cuda")

    def rate(run: Callable[[], Any]) -> float:
        run()
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(10):
            run()
        torch.cuda.synchronize()
        return nbytes * 10 / (time.perf_counter() - began) / 1e9

    return {
        "h2d_gb_per_s": rate(lambda: dst.copy_(src, non_blocking=True)),
        "d2h_gb_per_s": rate(lambda: src.copy_(dst, non_blocking=True)),
    }


def one_layer(chunk: int) -> dict[str, Any]:
    """Section 1: the last chunk's attention in one layer, three ways."""
    start, end = CONTEXT - chunk, CONTEXT
    g = torch.Generator(device="cuda").manual_seed(2)
    k = torch.randn(CONTEXT, KV_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    v = torch.randn(CONTEXT, KV_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    q = torch.randn(chunk, Q_HEADS, DIM, dtype=DTYPE, device="cuda", generator=g)
    gpu_b, spill_b = GPU_TOKENS * TOKEN_BYTES, SPILLED * TOKEN_BYTES
    mapped = Range(
        [
            (create(gpu_b), gpu_b),
            (create(spill_b, on_host=True), spill_b),
            (create(gpu_b), gpu_b),
            (create(spill_b, on_host=True), spill_b),
        ]
    )
    mk, mv = mapped.tokens(0, CONTEXT), mapped.tokens(CONTEXT * TOKEN_BYTES, CONTEXT)
    mk.copy_(k)
    mv.copy_(v)
    host_k, host_v = k[GPU_TOKENS:].cpu().pin_memory(), v[GPU_TOKENS:].cpu().pin_memory()
    scratch_k, scratch_v = torch.empty_like(k), torch.empty_like(v)
    scratch_k[:GPU_TOKENS], scratch_v[:GPU_TOKENS] = k[:GPU_TOKENS], v[:GPU_TOKENS]

    def staged() -> torch.Tensor:
        scratch_k[GPU_TOKENS:].copy_(host_k, non_blocking=True)
        scratch_v[GPU_TOKENS:].copy_(host_v, non_blocking=True)
        return attend(q, scratch_k[:end], scratch_v[:end])

    arms = {
        "all_gpu": lambda: attend(q, k[:end], v[:end]),
        "staged_copy_then_attend": staged,
        "in_place_host_mapped": lambda: attend(q, mk[:end], mv[:end]),
    }
    outs = {name: run() for name, run in arms.items()}
    k2 = k.clone()
    k2[GPU_TOKENS + 1000] += 1.0  # the control: one spilled token's K changed
    control = attend(q, k2[:end], v[:end])
    result: dict[str, Any] = {"chunk": chunk, "start": start, "host_bytes_k_and_v": 2 * spill_b}
    for name, run in arms.items():
        ms = []
        for _ in range(3 if name != "in_place_host_mapped" else 2):
            torch.cuda.synchronize()
            began = time.perf_counter()
            run()
            torch.cuda.synchronize()
            ms.append((time.perf_counter() - began) * 1e3)
        same = bool(torch.equal(outs[name], outs["all_gpu"]))
        result[name] = {
            "ms_median": statistics.median(ms),
            "ms_min_max": [min(ms), max(ms)],
            "bit_identical_to_all_gpu": same,
        }
    result["control_changed_output"] = not torch.equal(control, outs["all_gpu"])
    result["in_place_extra_ms"] = (
        result["in_place_host_mapped"]["ms_median"] - result["all_gpu"]["ms_median"]
    )
    return result


def main() -> None:
    torch.manual_seed(0)
    torch.zeros(1, device="cuda")
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "shape": {
            "q_heads": Q_HEADS,
            "kv_heads": KV_HEADS,
            "dim": DIM,
            "hidden": HIDDEN,
            "mlp": MLP,
            "layers": LAYERS,
            "dtype": "bfloat16",
        },
        "context_tokens": CONTEXT,
        "gpu_tokens": GPU_TOKENS,
        "spilled_tokens": SPILLED,
        "kv_bytes_per_token_all_layers": 2 * TOKEN_BYTES * LAYERS,
    }
    target = os.environ.get("OUT", ".")

    def save() -> None:
        with open(f"{target}/staged_prefill_probe_{CONTEXT}.json", "w") as f:
            json.dump(out, f, indent=1)

    out["attend_max_abs_diff_vs_float32"] = attend_check()  # bf16: ~1e-2 at most
    print("attend check", out["attend_max_abs_diff_vs_float32"], flush=True)
    out["copy"] = copy_rate(SPILLED * TOKEN_BYTES)
    print("copy", out["copy"], flush=True)
    try:
        if os.environ.get("PROBE_ONE_LAYER", "1") == "0":
            raise RuntimeError("skipped (PROBE_ONE_LAYER=0)")
        out["one_layer"] = one_layer(8192)
    except Exception as exc:  # say what failed, go on to the stack
        out["one_layer"] = {"error": repr(exc)[:400]}
    print("one layer", out["one_layer"], flush=True)
    torch.cuda.empty_cache()
    save()
    weights = Weights()
    prompt = torch.randn(CONTEXT, HIDDEN, dtype=DTYPE, device="cuda")
    backing = Backing()
    arms: list[Any] = [
        AllGpu(),
        Staged(backing, 2, True),
        Staged(backing, 1, True),
        Staged(backing, 1, False),
    ]
    rate = out["copy"]["h2d_gb_per_s"] * 1e9
    out["stack"] = {}
    for chunk in CHUNKS:
        if time.perf_counter() - STARTED > TIME_BUDGET_S:
            out["stack"][str(chunk)] = {"skipped": "time budget"}
            continue
        runs: dict[str, list[list[float]]] = {a.name: [] for a in arms}
        outputs: dict[str, list[torch.Tensor]] = {}
        prefill(arms[0], weights, prompt, chunk)  # warm-up
        for _ in range(REPEATS[chunk]):  # arms interleaved
            for arm in arms:
                times, outs = prefill(arm, weights, prompt, chunk)
                runs[arm.name].append(times)
                outputs[arm.name] = outs
        ttft = {n: [sum(t) for t in r] for n, r in runs.items()}
        all_gpu = statistics.median(ttft["all_gpu"])
        h2d = h2d_tokens(chunk) * 2 * TOKEN_BYTES * LAYERS
        row: dict[str, Any] = {
            "h2d_bytes": h2d,
            "d2h_bytes": SPILLED * 2 * TOKEN_BYTES * LAYERS,
            "floor_ms": all_gpu + h2d / rate * 1e3,
            "copy_ms_at_measured_rate": h2d / rate * 1e3,
        }
        for name, values in ttft.items():
            med = statistics.median(values)
            row[name] = {
                "ttft_model_ms_median": med,
                "ttft_model_ms_min_max": [min(values), max(values)],
                "vs_all_gpu": med / all_gpu,
                "chunk_ms_median": [statistics.median(c) for c in zip(*runs[name], strict=True)],
                "bit_identical_to_all_gpu": all(
                    torch.equal(a, b)
                    for a, b in zip(outputs[name], outputs["all_gpu"], strict=True)
                ),
            }
            if name != "all_gpu" and h2d:
                row[name]["copy_hidden_fraction"] = (
                    1 - (med - all_gpu) / row["copy_ms_at_measured_rate"]
                )
        out["stack"][str(chunk)] = row
        print(chunk, json.dumps(row)[:3000], flush=True)
        save()
    if time.perf_counter() - STARTED < TIME_BUDGET_S + 60:  # the control: one spilled token
        changed = prompt.clone()
        changed[CONTEXT * 3 // 4] += 1.0
        _, base = prefill(arms[0], weights, prompt, CHUNKS[0])
        _, moved = prefill(arms[0], weights, changed, CHUNKS[0])
        out["control_changed_last_output"] = not torch.equal(base[-1], moved[-1])
    out["elapsed_s"] = time.perf_counter() - STARTED
    save()


if __name__ == "__main__":
    main()
