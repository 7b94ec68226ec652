#!/usr/bin/env python3
"""Issue #19 on the GPU host: does a layer-wise CPU-tier load (patch 0005) give the same
tokens as a GPU prefix hit, and does it load the whole document? One server per arm
through `vllm-offload serve` (Llama-3-8B shape, dummy weights, a GPU pool of
--pool-tokens), greedy, token ids back:

  1. DOC + tail A, cold                      (computed)
  2. DOC + tail A again                      (GPU prefix hit)
  3. --fillers other documents               (DOC leaves the GPU pool)
  4. DOC + tail A                            (CPU-tier hit: must equal 2)
  5. fillers again, DOC + tail B             (CPU-tier hit, another tail)
  6. DOC + tail B again                      (GPU prefix hit: must equal 5)

Arms: layerwise (kv_offload.layerwise_loads = true, the default) and async (false: vLLM's
own way). A load that did not wait for its layer would read blocks not yet copied and
change the tokens. Dummy weights barely depend on the context (they repeat one token):
--checkpoint DIR serves random weights instead (random_checkpoint.py, std 0.02), each
answer's logprobs are compared too, and a control (the document with one token changed,
computed) shows how far a wrong document moves them. With --cuda-graphs (no
--enforce-eager), --tail-tokens 1 and --decoy-tokens N, each CPU hit has one token to
compute while another request decodes: vLLM runs such a step as a full CUDA graph, where
no layer waits for its own copy. Writes OUT/layerwise_check.json and each server's log.

    benchmarks/gpu/layerwise_check.py --out DIR [--cuda-graphs --tail-tokens 1 --decoy-tokens 400]
"""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.model import KV_BYTES_PER_TOKEN
from kit.record import Record

from vllm_offload.bench.server_process import ServerProcess

MODEL = "benchmarks/models/llama-3-8b"
DUMMY = ["--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager"]


Answer = dict[str, list[Any]]


def complete(http: httpx.Client, prompt: list[int], max_tokens: int) -> Answer:
    """The output's token ids and their logprobs (as token ids: no tokenizer). Dummy
    weights barely depend on the context, so equal tokens alone could hide KV that was
    never loaded: the loaded bytes are checked too."""
    response = http.post(
        "/v1/completions",
        json={
            "model": "m",
            "prompt": prompt,
            "max_tokens": max_tokens,
            "min_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "return_token_ids": True,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
    )
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return {"ids": list(choice["token_ids"]), "logprobs": choice["logprobs"]["token_logprobs"]}


def logprob_diff(a: Answer, b: Answer) -> float:
    return max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"], strict=True))


def first_difference(a: Answer, b: Answer) -> int | None:
    """The first output position whose token differs (None: none does)."""
    pairs = enumerate(zip(a["ids"], b["ids"], strict=True))
    return next((i for i, (x, y) in pairs if x != y), None)


def loaded_bytes(http: httpx.Client) -> float:
    """vLLM's counter of bytes the CPU tier loaded to the GPU."""
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("vllm:kv_offload_total_bytes_total") and "CPU_to_GPU" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--model", default=MODEL, help="a model folder (config.json suffices)")
    parser.add_argument(
        "--checkpoint", type=Path, help="a random checkpoint's folder: served instead of dummy"
    )
    parser.add_argument("--pool-tokens", type=int, default=32768)
    parser.add_argument("--doc-tokens", type=int, default=8000)
    parser.add_argument("--fillers", type=int, default=5)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--arms", default="layerwise,async")
    parser.add_argument("--cuda-graphs", action="store_true", help="serve without --enforce-eager")
    parser.add_argument("--tail-tokens", type=int, default=64)
    parser.add_argument(
        "--decoy-tokens",
        type=int,
        default=0,
        help="a request decoding this many tokens beside each CPU hit",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 100000) for _ in range(n)]

    doc, tail_a, tail_b = (
        tokens(args.doc_tokens),
        tokens(args.tail_tokens),
        tokens(args.tail_tokens),
    )
    decoy = tokens(64)
    dummy = [a for a in DUMMY if not (args.cuda_graphs and a == "--enforce-eager")]
    if args.checkpoint:
        args.model = str(args.checkpoint)
        dummy = [a for a in dummy if a not in ("--load-format", "dummy")]
    changed = [*doc[:100], doc[100] + 1, *doc[101:]]  # the control's document
    fillers = [tokens(args.doc_tokens) for _ in range(args.fillers)]
    pool = ["--gpu-kv-cache-memory-bytes", str(args.pool_tokens * KV_BYTES_PER_TOKEN)]
    tier = ["--kv-offload-backend", "native", "--kv-offload-cpu-tier-gib", "16"]
    result = Record(args.out / "layerwise_check.json", vars(args))
    result["arms"] = {}
    for name in args.arms.split(","):
        flags = [*tier, "--kv-offload-layerwise-loads", str(name == "layerwise").lower()]
        server = ServerProcess(
            serve_args=["--model", args.model, *pool, *flags, "--", *dummy],
            log_path=args.out / f"{name}.log",
        )
        arm: dict[str, Any] = {"flags": flags}
        result["arms"][name] = arm
        server.start()
        try:
            arm["healthy_s"] = server.wait_healthy()
            http = httpx.Client(base_url=server.base_url, timeout=600)

            def evict(http: httpx.Client = http) -> None:
                for filler in fillers:
                    complete(http, filler, 1)

            def beside_a_decode(prompt: list[int], http: httpx.Client = http) -> Answer:
                if not args.decoy_tokens:
                    return complete(http, prompt, args.output_tokens)
                other = httpx.Client(base_url=http.base_url, timeout=600)
                decoding = threading.Thread(target=complete, args=(other, decoy, args.decoy_tokens))
                decoding.start()
                time.sleep(0.5)  # the decoy is past its prefill, decoding
                answer = complete(http, prompt, args.output_tokens)
                decoding.join()
                return answer

            steps: dict[str, Answer] = {}
            loads: dict[str, float] = {}
            steps["cold_a"] = complete(http, doc + tail_a, args.output_tokens)
            steps["gpu_hit_a"] = complete(http, doc + tail_a, args.output_tokens)
            evict()
            before = loaded_bytes(http)
            steps["cpu_hit_a"] = beside_a_decode(doc + tail_a)
            loads["cpu_hit_a"] = loaded_bytes(http) - before
            evict()
            before = loaded_bytes(http)
            steps["cpu_hit_b"] = beside_a_decode(doc + tail_b)
            loads["cpu_hit_b"] = loaded_bytes(http) - before
            steps["gpu_hit_b"] = complete(http, doc + tail_b, args.output_tokens)
            steps["control"] = complete(http, changed + tail_a, args.output_tokens)
            arm["tokens"] = steps
            arm["loaded_bytes"] = loads
            arm["cpu_hit_a_equals_gpu_hit"] = steps["cpu_hit_a"] == steps["gpu_hit_a"]
            arm["cpu_hit_b_equals_gpu_hit"] = steps["cpu_hit_b"] == steps["gpu_hit_b"]
            arm["cold_equals_gpu_hit"] = steps["cold_a"] == steps["gpu_hit_a"]
            arm["max_logprob_diff"] = {
                "cpu_hit_a_vs_gpu_hit": logprob_diff(steps["cpu_hit_a"], steps["gpu_hit_a"]),
                "cpu_hit_b_vs_gpu_hit": logprob_diff(steps["cpu_hit_b"], steps["gpu_hit_b"]),
                "cold_vs_gpu_hit": logprob_diff(steps["cold_a"], steps["gpu_hit_a"]),
                # the control is computed as the cold answer is: compared with that one
                "control_vs_cold": logprob_diff(steps["control"], steps["cold_a"]),
            }
            arm["control_first_token_differing"] = first_difference(
                steps["control"], steps["cold_a"]
            )
            # the tier holds the document's whole 256-token chunks
            expected = args.doc_tokens // 256 * 256 * KV_BYTES_PER_TOKEN
            arm["loaded_whole_document"] = all(b == expected for b in loads.values())
            print(name, {k: v for k, v in arm.items() if k not in ("tokens", "flags")}, flush=True)
        except Exception as exc:  # record and go on: the other arm still measures
            arm["error"] = repr(exc)
            print(name, "failed:", exc, flush=True)
        finally:
            server.stop()
        result.save()


if __name__ == "__main__":
    main()
