#!/usr/bin/env python3
"""Issue #22 on the GPU host: one request longer than the GPU pool, through patch 0006's
host extension (kv_offload.host_extension_gib). Llama-3.1-8B shape (128k positions),
dummy weights and a made-up word-level tokenizer (so that vLLM returns logprobs), eager,
every server through `vllm-offload serve`, all up at once:

  reference  a GPU pool of --reference-gib (it holds the long request), no extension
  extended   a GPU pool of --pool-gib (2 GiB = 16k tokens) + --extension-gib of host RAM,
             with the native CPU tier (the default a user gets)
  ext-none   the same without a CPU tier (stores read host blocks: kept apart)
  ext-graphs extended with CUDA graphs (not in the default --arms): decode steps replayed
             as full graphs read the host blocks too

Dummy weights barely depend on the context, so the control changes one token of the long
prompt in the part the extended pool keeps in host RAM: on the reference, the logprobs
must change, or their equality would prove nothing. With dummy weights they do not
(measured); --weights takes a random checkpoint of deviation 0.02 (random_checkpoint.py
--std 0.02), whose attention is sharp enough that they do.

Each server: the long request (--long-tokens of random token ids, greedy, --output-tokens,
5 logprobs), streamed, for its TTFT and the time of each token; then --short-repeats short
requests (512 in, 128 out) alone, interleaved over the servers: they never reach host
blocks and must keep their speed. Correct means the same token ids and the same logprobs
as the reference. The cost model (docs/design/long-context.md): a decode step reads the
spilled KV once over PCIe; a prefill chunk reads the host part once per 128-row query
tile of FlashAttention 3 (chunk x 4 grouped heads / 128). Writes OUT/host_extension.json
and each server's log.

    benchmarks/gpu/host_extension.py --out DIR
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.arms import start_arms
from kit.model import GIB, KV_BYTES_PER_TOKEN, write_model
from kit.record import Record
from kit.stream import compare_records, stream_record

from vllm_offload.bench.server_process import ServerProcess

QUERY_ROWS_PER_KV_READ = 128 / 4  # FA3 tiles 128 rows of 4 grouped query heads: 32 tokens


def prefill_host_bytes(long_tokens: int, gpu_tokens: int, chunk: int) -> float:
    """Bytes FlashAttention 3 reads from host blocks over a chunked prefill that puts
    everything past ``gpu_tokens`` there: each chunk reads the host part of its context
    (its own tokens included) once per 128-row query tile."""
    total = 0.0
    for start in range(0, long_tokens, chunk):
        end = min(start + chunk, long_tokens)
        host = max(0, end - gpu_tokens)
        total += host * KV_BYTES_PER_TOKEN * ((end - start) / QUERY_ROWS_PER_KV_READ)
    return total


def mapping_check() -> dict[str, Any]:
    """Patch 0006's allocator alone, before any server: a two-layer pool of 8 blocks of 2 MiB
    pages, the last 4 in host RAM. GPU memory must grow by the GPU part only, what is
    written through the mapping must read back, and dropping the tensor gives it back."""
    from types import SimpleNamespace

    import torch

    from vllm_offload.vllm_ext import kv_host_mapping

    page = 2 << 20
    tensor = SimpleNamespace(layers=["a", "b"], layer_stride=8 * page, block_stride=page, offset=0)
    config = SimpleNamespace(num_blocks=8, num_host_blocks=4, kv_cache_tensors=[tensor])
    torch.zeros(1, device="cuda")
    free_before = torch.cuda.mem_get_info()[0]
    buf = kv_host_mapping.allocate(config, 16 * page, torch.device("cuda", 0))
    torch.cuda.synchronize()
    gpu_taken = free_before - torch.cuda.mem_get_info()[0]
    buf.copy_(torch.arange(buf.numel(), device="cuda", dtype=torch.int64).to(torch.int8))
    expected = torch.arange(buf.numel(), dtype=torch.int64).to(torch.int8)
    reads_back = bool(torch.equal(buf.cpu(), expected))
    del buf  # the last reference: the mapping is unmapped and its memory given back
    gc.collect()
    torch.cuda.empty_cache()  # the check's own tensors, cached by torch
    return {
        "host_ranges": kv_host_mapping.host_ranges(config),
        "gpu_bytes_taken": gpu_taken,
        "gpu_bytes_expected": 8 * page,
        "reads_back": reads_back,
        "gpu_bytes_held_after_release": free_before - torch.cuda.mem_get_info()[0],
    }


def main() -> None:
    parser = options.parser(
        __doc__,
        pool_gib=2.0,
        extension_gib=8.0,
        reference_gib=12.0,
        long_tokens=65536,
        output_tokens=32,
        chunk_tokens=8192,
    )
    parser.add_argument("--short-repeats", type=int, default=4)
    parser.add_argument("--arms", default="reference,extended,ext-none")
    parser.add_argument("--weights", type=Path, help="a checkpoint folder (default: dummy)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = write_model(Path("/tmp/host-extension-model"), args.weights)
    result = Record(args.out / "host_extension.json", vars(args))
    result["arms"] = {}
    try:
        result["mapping_check"] = mapping_check()
    except Exception as exc:  # the servers will say more
        result["mapping_check"] = {"error": repr(exc)}
    print("mapping check:", result["mapping_check"], flush=True)
    rng = random.Random(0)
    long_prompt = [rng.randrange(1000, 100000) for _ in range(args.long_tokens)]
    shorts = [[rng.randrange(1000, 100000) for _ in range(512)] for _ in range(args.short_repeats)]

    common = [
        "--model",
        str(model),
        "--gpu-memory-utilization",
        "0.3",
        "--kv-offload-cpu-tier-gib",
        "8",
    ]
    dummy = [] if args.weights else ["--load-format", "dummy"]
    vllm = ["--gpu-prefill-chunk-tokens", str(args.chunk_tokens), "--", *dummy, "--enforce-eager"]
    pool = {
        name: ["--gpu-kv-cache-memory-bytes", str(int(gib * GIB))]
        for name, gib in (
            ("reference", args.reference_gib),
            ("extended", args.pool_gib),
            ("ext-none", args.pool_gib),
        )
    }
    flags = {
        "reference": ["--kv-offload-backend", "native"],
        "extended": [
            "--kv-offload-backend",
            "native",
            "--kv-offload-host-extension-gib",
            str(args.extension_gib),
        ],
        "ext-none": [
            "--kv-offload-backend",
            "none",
            "--kv-offload-block-size",
            "128",
            "--kv-offload-host-extension-gib",
            str(args.extension_gib),
        ],
    }
    flags["ext-graphs"] = flags["extended"]
    pool["ext-graphs"] = pool["extended"]
    arms = args.arms.split(",")

    def serve_args(name: str) -> list[str]:
        theirs = [a for a in vllm if not (name == "ext-graphs" and a == "--enforce-eager")]
        return [*common, *pool[name], *flags[name], *theirs]

    servers = {
        name: ServerProcess(serve_args=serve_args(name), log_path=args.out / f"{name}.log")
        for name in arms
    }

    def save() -> None:
        result.save()

    try:
        live = start_arms(servers, flags, result["arms"])
        for name in live:  # the long request on each, one at a time
            arm = result["arms"][name]
            try:
                with httpx.Client(base_url=servers[name].base_url, timeout=900) as http:
                    arm["long"] = stream_record(http, long_prompt, args.output_tokens)
                print(
                    name,
                    "long: TTFT",
                    arm["long"]["ttft_s"],
                    "TPOT",
                    arm["long"]["tpot_median_s"],
                    flush=True,
                )
            except Exception as exc:
                arm["error"] = repr(exc)
                print(name, "failed:", exc, flush=True)
            save()
        if "reference" in live:  # the control: are these logprobs sensitive at all?
            changed = list(long_prompt)
            at = args.long_tokens * 3 // 4  # a token the extended pool keeps in host RAM
            changed[at] = changed[at] + 1
            with httpx.Client(base_url=servers["reference"].base_url, timeout=900) as http:
                control = stream_record(http, changed, args.output_tokens)
            original = result["arms"]["reference"].get("long")
            result["control"] = {"changed_token_at": at}
            if original:  # the control must differ: same_* false
                result["control"] |= compare_records(control, original)
            print("control:", result["control"], flush=True)
        for index, prompt in enumerate(shorts):  # interleaved, rotating the order
            order = live[index % len(live) :] + live[: index % len(live)]
            for name in order:
                arm = result["arms"][name]
                if "error" in arm:
                    continue
                with httpx.Client(base_url=servers[name].base_url, timeout=300) as http:
                    short = stream_record(http, prompt, 128)
                arm.setdefault("short_tpot_s", []).append(short["tpot_median_s"])
                arm.setdefault("short_ttft_s", []).append(short["ttft_s"])
    finally:
        for server in servers.values():
            server.stop()

    reference = result["arms"].get("reference", {}).get("long")
    for name in arms:
        arm = result["arms"][name]
        long = arm.get("long")
        if not long or not reference or name == "reference":
            continue
        arm |= compare_records(long, reference)
        split = arm.get("split")
        if split and long["tpot_median_s"] and reference["tpot_median_s"]:
            spilled = max(0, args.long_tokens + args.output_tokens - split["gpu_tokens"])
            step_bytes = spilled * KV_BYTES_PER_TOKEN
            extra = long["tpot_median_s"] - reference["tpot_median_s"]
            rate = step_bytes / extra if extra > 0 else None
            prefill = prefill_host_bytes(args.long_tokens, split["gpu_tokens"], args.chunk_tokens)
            arm["cost_model"] = {
                "spilled_tokens_at_decode": spilled,
                "decode_step_host_bytes": step_bytes,
                "decode_extra_s_per_step": extra,
                "decode_read_rate_gbps": None if rate is None else rate / 1e9,
                "decode_tok_per_s": 1 / long["tpot_median_s"],
                "reference_decode_tok_per_s": 1 / reference["tpot_median_s"],
                "prefill_host_bytes_read": prefill,
                "prefill_extra_s": long["ttft_s"] - reference["ttft_s"],
                "prefill_predicted_extra_s_at_decode_rate": (
                    None if rate is None else prefill / rate
                ),
                "prefill_read_rate_gbps": prefill / (long["ttft_s"] - reference["ttft_s"]) / 1e9,
            }
        shorts_here = arm.get("short_tpot_s") or []
        shorts_ref = result["arms"]["reference"].get("short_tpot_s") or []
        if shorts_here and shorts_ref:
            arm["short_tpot_median_vs_reference"] = [
                statistics.median(shorts_here),
                statistics.median(shorts_ref),
            ]
    for name, arm in result["arms"].items():
        summary = {k: v for k, v in arm.items() if k not in ("long", "flags")}
        if arm.get("long"):
            summary["long"] = {k: arm["long"][k] for k in ("ttft_s", "total_s", "tpot_median_s")}
        print(name, json.dumps(summary, indent=1), flush=True)
    save()


if __name__ == "__main__":
    main()
