#!/usr/bin/env python3
"""Issue #41 end to end on the GPU host: one request longer than the GPU pool, served
through `vllm-offload serve` with CUDA graphs on (how users serve), staged prefill against
the all-GPU pool of the same total size. Llama-3.1-8B shape with --weights (a random
checkpoint of deviation 0.02: random_checkpoint.py --std 0.02) or dummy weights.

  reference  a GPU pool of --reference-gib (it holds the long request), no extension
  staged     a GPU pool of --pool-gib + --extension-gib of host RAM, staged prefill
             (kv_offload.staged_prefill, the default); its scratch comes out of the pool
  in-place   the same with kv_offload.staged_prefill = false (today's path: the prefill
             reads host blocks once per query tile); not in the default --arms
  NAME       with --arm-from NAME=DIR: staged's flags, its server importing vllm_offload
             from the checkout DIR (a branch measured beside this tree in the same run)

Each arm: the long request (--long-tokens random ids, greedy, --output-tokens, 5
logprobs), streamed, for its TTFT and the time of each token; on the reference, the
control (one token the extended pool keeps in host RAM changed) must change the answer.
Beside them: the floor (all-GPU TTFT + the host bytes the staged chunks copy / the
measured host-to-GPU rate) and the decode link model (reference step + spilled bytes /
that rate). Writes OUT/staged_prefill.json and each server's log.

    benchmarks/gpu/staged_prefill.py --out DIR [--weights CKPT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.arms import start_arms
from kit.link import h2d_rate, staged_copy_bytes
from kit.model import GIB, KV_BYTES_PER_TOKEN, write_model
from kit.stream import compare_records, stream_record

from vllm_offload.bench.server_process import ServerProcess


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
    parser.add_argument("--arms", default="reference,staged")
    parser.add_argument("--utilization", default="reference=0.45,staged=0.3,in-place=0.3")
    parser.add_argument("--weights", type=Path, help="a checkpoint folder (default: dummy)")
    parser.add_argument("--arm-from", action="append", default=[], metavar="NAME=DIR")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = write_model(Path("/tmp/staged-prefill-model"), args.weights)
    result: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "h2d_bytes_per_s": h2d_rate(),
        "arms": {},
    }
    rng = random.Random(0)
    long_prompt = [rng.randrange(1000, 100000) for _ in range(args.long_tokens)]
    utilization = dict(item.split("=") for item in args.utilization.split(","))
    extended = ["--kv-offload-host-extension-gib", str(args.extension_gib)]
    flags = {
        "reference": ["--gpu-kv-cache-memory-bytes", str(int(args.reference_gib * GIB))],
        "staged": ["--gpu-kv-cache-memory-bytes", str(int(args.pool_gib * GIB)), *extended],
        "in-place": [
            "--gpu-kv-cache-memory-bytes",
            str(int(args.pool_gib * GIB)),
            *extended,
            "--kv-offload-staged-prefill",
            "false",
        ],
    }
    flags["reference-again"] = flags["reference"]  # is the all-GPU answer repeatable?
    trees = dict(item.split("=", 1) for item in args.arm_from)
    for name in trees:
        flags[name] = flags["staged"]
    dummy = [] if args.weights else ["--load-format", "dummy"]
    arms = args.arms.split(",")

    def serve_args(name: str) -> list[str]:
        return [
            "--model",
            str(model),
            "--gpu-memory-utilization",
            utilization[name],
            "--kv-offload-backend",
            "none",
            *flags[name],
            "--gpu-prefill-chunk-tokens",
            str(args.chunk_tokens),
            "--",
            *dummy,
        ]

    def env(name: str) -> dict[str, str] | None:
        if name not in trees:
            return None
        return os.environ | {"PYTHONPATH": f"{trees[name]}:{os.environ.get('PYTHONPATH', '')}"}

    servers = {
        name: ServerProcess(
            serve_args=serve_args(name), log_path=args.out / f"{name}.log", env=env(name)
        )
        for name in arms
    }

    def save() -> None:
        (args.out / "staged_prefill.json").write_text(json.dumps(result, indent=1) + "\n")

    try:
        live = start_arms(servers, flags, result["arms"])
        for name in live:
            arm = result["arms"][name]
            try:
                with httpx.Client(base_url=servers[name].base_url, timeout=1800) as http:
                    stream_record(http, long_prompt[:512], 4)  # warm: the first request's compiles
                    arm["long"] = stream_record(http, long_prompt, args.output_tokens)
                print(name, "TTFT", arm["long"]["ttft_s"], "TPOT", arm["long"]["tpot_median_s"])
            except Exception as exc:
                arm["error"] = repr(exc)
                print(name, "failed:", exc, flush=True)
            save()
        if "reference" in live:
            changed = list(long_prompt)
            at = args.long_tokens * 3 // 4  # a token the extended pool keeps in host RAM
            changed[at] += 1
            with httpx.Client(base_url=servers["reference"].base_url, timeout=1800) as http:
                control = stream_record(http, changed, args.output_tokens)
            original = result["arms"]["reference"].get("long")
            result["control"] = {"changed_token_at": at} | (
                compare_records(control, original) if original else {}
            )
            print("control (must differ):", result["control"], flush=True)
    finally:
        for server in servers.values():
            server.stop()
    summarize(result, args)
    save()


def summarize(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Each extended arm against the reference: same answer, TTFT ratio, the floor, the
    decode link model."""
    reference = result["arms"].get("reference", {}).get("long")
    rate = result["h2d_bytes_per_s"]
    for name, arm in result["arms"].items():
        long, split = arm.get("long"), arm.get("split")
        if name == "reference" or not (long and reference):
            continue
        arm |= compare_records(long, reference)
        if not split:
            continue
        copied = staged_copy_bytes(args.long_tokens, split["gpu_tokens"], args.chunk_tokens)
        spilled = max(0, args.long_tokens + args.output_tokens - split["gpu_tokens"])
        link_step = reference["tpot_median_s"] + spilled * KV_BYTES_PER_TOKEN / rate
        arm["vs_reference"] = {
            "ttft_ratio": long["ttft_s"] / reference["ttft_s"],
            "floor_ttft_s": reference["ttft_s"] + copied / rate,
            "floor_ratio": (reference["ttft_s"] + copied / rate) / reference["ttft_s"],
            "staged_copy_bytes": copied,
            "decode_tok_per_s": 1 / long["tpot_median_s"],
            "reference_decode_tok_per_s": 1 / reference["tpot_median_s"],
            "link_model_decode_tok_per_s": 1 / link_step,
            "decode_vs_link_model": link_step / long["tpot_median_s"],
        }
    for name, arm in result["arms"].items():
        shown = {k: v for k, v in arm.items() if k not in ("long", "flags")}
        if arm.get("long"):
            shown["long"] = {k: arm["long"][k] for k in ("ttft_s", "total_s", "tpot_median_s")}
        print(name, json.dumps(shown, indent=1), flush=True)


if __name__ == "__main__":
    main()
