#!/usr/bin/env python3
"""Issue #42 part 2 on the GPU host: the original fork's own case, honestly. Its claim was
"52,000 tokens on an RTX 4090 at ~45 tokens/s" with Qwen3-Coder-30B-A3B-Instruct-AWQ,
reached by counting host RAM in the GPU check. Here: that model class (benchmarks/models/
qwen3-coder-30b-a3b-awq: the real config.json, AWQ 4-bit; dummy weights), one 52,000-token
request (prompt and output together: --long-tokens is max_model_len, which vLLM checks
prompt + max_tokens against) through `vllm-offload serve` with CUDA graphs, on the pool a
24 GiB card gets:

  reference  an all-GPU pool of --reference-gib (holds the request), bf16 KV
  bf16-ext   a 24 GiB card: --gpu-memory-utilization scaled so that vLLM's budget is the
             card's (0.9 x 24 GiB), vLLM measures its own pool; the rest of the request
             in --extension-gib of host RAM (staged prefill, the default)
  fp8        the same card, model.kv_cache_dtype = "fit" (fp8 where bf16 does not fit),
             no extension

vLLM's defaults for a card under 70 GiB are set by hand (--chunk-tokens 2048 per step,
--max-num-seqs 256), as a 4090 would run. The arms run one after another (each measures
its own pool: another server starting beside it would skew the profile). Each arm: the
long request (random ids, greedy, --output-tokens, streamed) for its TTFT and decode
rate; what vLLM logged (weights loaded, KV pool, the GPU/host split); what `vllm-offload
plan` said for a 24 GiB card with the arm's settings before any server started. Beside
them: the decode link model (the reference's step + the spilled KV / a host-to-GPU rate)
and the prefill floor (the reference's TTFT + the bytes staged prefill copies / that
rate), at the rate measured here and at PCIe 4.0's (--link-gbps, ~25 GB/s: a 4090's
link). Writes OUT/fork_case.json (after each arm) and each server's log.

    benchmarks/gpu/fork_case.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.link import h2d_rate, staged_copy_bytes
from kit.model import GIB, split_line, write_model
from kit.stream import compare_records, stream_record

from vllm_offload.bench.server_process import VLLM_OFFLOAD, ServerProcess, scan_log

CONFIG = Path(__file__).resolve().parents[1] / "models/qwen3-coder-30b-a3b-awq/config.json"
VOCAB = 151936
KV_BYTES_PER_TOKEN = 48 * 2 * 4 * 128 * 2  # layers x K,V x KV heads x head_dim x bf16
CARD_UTILIZATION = 0.9  # gpu.memory_utilization's default: the budget the planner gives a card
VLLM_LOG = {
    "model_loading_gib": r"Model loading took ([\d.]+) GiB",
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
}
PLAN_KEYS = (
    "weight_bytes",
    "kv_cache_dtype",
    "gpu_budget_bytes",
    "gpu_kv_pool_bytes",
    "gpu_kv_pool_tokens",
    "longest_request_tokens",
    "host_extension_bytes",
    "staging_scratch_bytes",
    "prefill_chunk_tokens",
    "prefill_chunk_added_bytes",
    "spilled_decode_steps_per_s_ceiling",
    "h2d_bytes_per_s",
)


def settings(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each arm's own `vllm-offload serve` flags: what `plan` is asked about too (the
    chunk too: the plan counts its activations)."""
    chunk = ["--gpu-prefill-chunk-tokens", str(args.chunk_tokens)]
    return {
        "reference": ["--gpu-kv-cache-memory-bytes", str(int(args.reference_gib * GIB)), *chunk],
        "bf16-ext": ["--kv-offload-host-extension-gib", str(args.extension_gib), *chunk],
        "fp8": ["--model-kv-cache-dtype", "fit", *chunk],
    }


def utilization(name: str, args: argparse.Namespace, total_bytes: int) -> str:
    """The reference's own; the card arms': vLLM's budget on this GPU = the card's."""
    if name == "reference":
        return str(args.reference_utilization)
    return f"{args.card_gib * GIB * CARD_UTILIZATION / total_bytes:.4f}"


def planned(model: Path, args: argparse.Namespace, flags: list[str]) -> dict[str, Any]:
    """What `vllm-offload plan` says for a 24 GiB card (at gpu.memory_utilization's
    default) with an arm's settings."""
    argv = [
        *VLLM_OFFLOAD,
        "plan",
        "--model",
        str(model),
        "--gpu-mem-gib",
        str(args.card_gib),
        "--ram-gib",
        str(args.ram_gib),
        "--model-max-model-len",
        str(args.long_tokens),
        "--kv-offload-backend",
        "none",
        *flags,
        "--json",
    ]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        return {"refused": done.stderr.strip()[-600:]}
    plan = json.loads(done.stdout)
    return {key: plan.get(key) for key in PLAN_KEYS}


def logged(log: str) -> dict[str, Any]:
    """What vLLM (patched) logged about the weights, the KV pool and the host split."""
    found: dict[str, Any] = {"kv_cache_tokens": scan_log(log)["kv_cache_tokens"]}
    for key, pattern in VLLM_LOG.items():
        match = re.search(pattern, log)
        found[key] = float(match[1]) if match else None
    found["split"] = split_line(log)
    return found


def run_arm(
    name: str, serve_args: list[str], prompt: list[int], out: Path, output: int
) -> dict[str, Any]:
    """One server up, the long request, the server down."""
    server = ServerProcess(serve_args=serve_args, log_path=out / f"{name}.log")
    arm: dict[str, Any] = {"serve_args": serve_args}
    try:
        server.start()
        arm["healthy_s"] = server.wait_healthy(timeout_s=420)
        arm |= logged(server.log_path.read_text(errors="replace"))
        with httpx.Client(base_url=server.base_url, timeout=900) as http:
            stream_record(http, prompt[:512], 4)  # warm: the first request's compiles
            arm["long"] = stream_record(http, prompt, output)
        print(name, "TTFT", arm["long"]["ttft_s"], "TPOT", arm["long"]["tpot_median_s"], flush=True)
    except Exception as exc:
        arm["error"] = repr(exc)
        print(name, "failed:", exc, flush=True)
    finally:
        server.stop()
    return arm


def link_figures(
    arm: dict[str, Any], reference: dict[str, Any], args: argparse.Namespace, rate: float
) -> dict[str, float]:
    """The decode link model and the staged prefill's floor at ``rate`` bytes/s."""
    split = arm["split"]
    spilled = max(0, args.long_tokens - split["gpu_tokens"])
    copied = staged_copy_bytes(
        args.long_tokens - args.output_tokens,
        split["gpu_tokens"],
        args.chunk_tokens,
        KV_BYTES_PER_TOKEN,
    )
    step = reference["tpot_median_s"] + spilled * KV_BYTES_PER_TOKEN / rate
    return {
        "rate_gbps": rate / 1e9,
        "spilled_tokens_at_decode": spilled,
        "link_model_decode_tok_per_s": 1 / step,
        "decode_vs_link_model": step / arm["long"]["tpot_median_s"],
        "staged_copy_bytes": copied,
        "floor_ttft_s": reference["ttft_s"] + copied / rate,
    }


def summarize(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Each arm: TTFT and decode; the card arms against the reference, the link model and
    the plan (into ``result``)."""
    reference = result["arms"].get("reference", {}).get("long")
    for name, arm in result["arms"].items():
        long = arm.get("long")
        if not long:
            continue
        arm["decode_tok_per_s"] = 1 / long["tpot_median_s"]
        if name == "reference" or not reference:
            continue
        arm["vs_reference"] = compare_records(long, reference) | {
            "ttft_ratio": long["ttft_s"] / reference["ttft_s"],
            "decode_ratio": reference["tpot_median_s"] / long["tpot_median_s"],
        }
        if arm.get("split"):
            arm["link_here"] = link_figures(arm, reference, args, result["h2d_bytes_per_s"])
            pcie4 = link_figures(arm, reference, args, args.link_gbps * 1e9)
            del pcie4["decode_vs_link_model"]  # this GPU's link is not PCIe 4.0
            arm["link_pcie4"] = pcie4
    for arm in result["arms"].values():
        plan = arm.get("plan", {})
        if plan.get("gpu_kv_pool_bytes") and arm.get("available_kv_gib"):
            # the scratch is model memory to vLLM's profile: both figures are without it
            served = arm["available_kv_gib"] * GIB / plan["gpu_kv_pool_bytes"]
            arm["pool_bytes_served_vs_planned"] = served
        if plan.get("weight_bytes") and arm.get("model_loading_gib"):
            arm["weights_loaded_vs_planned"] = arm["model_loading_gib"] * GIB / plan["weight_bytes"]


def show(result: dict[str, Any]) -> None:
    """Each arm without its token lists."""
    for name, arm in result["arms"].items():
        shown = {k: v for k, v in arm.items() if k not in ("long", "serve_args")}
        if arm.get("long"):
            shown["long"] = {k: arm["long"][k] for k in ("ttft_s", "total_s", "tpot_median_s")}
        print(name, json.dumps(shown, indent=1), flush=True)


def main() -> None:
    parser = options.parser(
        __doc__,
        long_tokens=52000,
        output_tokens=64,
        chunk_tokens=2048,
        extension_gib=2.0,
        reference_gib=6.0,
    )
    parser.add_argument("--arms", default="reference,bf16-ext,fp8")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--card-gib", type=float, default=24.0)
    parser.add_argument("--ram-gib", type=float, default=64.0, help="the card's host, for plan")
    parser.add_argument("--reference-utilization", type=float, default=0.4)
    parser.add_argument("--link-gbps", type=float, default=25.0, help="PCIe 4.0 x16, usable")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    model = write_model(Path("/tmp/fork-case-model"), None, config=CONFIG, vocab=VOCAB)
    result: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "h2d_bytes_per_s": h2d_rate(),
        "gpu_total_bytes": torch.cuda.mem_get_info()[1],
        "arms": {},
    }
    torch.cuda.empty_cache()  # the rate's buffers: the servers measure what is free
    own = settings(args)
    common = ["--model", str(model), "--model-max-model-len", str(args.long_tokens)]
    common += ["--kv-offload-backend", "none"]
    theirs = ["--", "--load-format", "dummy", "--max-num-seqs", str(args.max_num_seqs)]
    rng = random.Random(0)
    # prompt + output = max_model_len: one token more and vLLM answers 400 (as it did here)
    prompt = [rng.randrange(1000, 100000) for _ in range(args.long_tokens - args.output_tokens)]

    def save() -> None:
        (args.out / "fork_case.json").write_text(json.dumps(result, indent=1) + "\n")

    for name in args.arms.split(","):
        arm: dict[str, Any] = {}
        if name != "reference":  # the card's plan, before its server starts
            arm["plan"] = planned(model, args, own[name])
        share = ["--gpu-memory-utilization", utilization(name, args, result["gpu_total_bytes"])]
        serve_args = [*common, *share, *own[name], *theirs]
        result["arms"][name] = arm | run_arm(name, serve_args, prompt, args.out, args.output_tokens)
        summarize(result, args)  # after each arm: a run stopped at its limit keeps its sums
        save()
    show(result)


if __name__ == "__main__":
    main()
