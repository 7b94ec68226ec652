#!/usr/bin/env python3
"""Issue #42 part 1 on the GPU host: chat streams beside one request spilled into the KV
pool's host extension. Llama-3.1-8B shape, dummy weights, CUDA graphs, one server per arm
through `vllm-offload serve`, all up at once, arms interleaved:

  gpu-only   a GPU pool of --pool-gib, no extension: the long request is refused (b)
  share-1    the same pool + --extension-gib of host RAM, kv_offload.spilled_step_share 1:
             patch 0006 alone, every step waits for the spilled request's host reads (a)
  share-S    the same with spilled_step_share S for each S in --shares (default 0.25,
             the default a user gets): the spilled request's steps take at most S of the
             time, and it holds at most half the GPU pool (vllm_ext/fair_scheduler.py) (c)

Each round, on each arm in a rotating order: --chats chat streams (--chat-in random
tokens in, --chat-out out) alone; then the long request (--long-tokens in, streamed) and,
once its first token is out (it is decoding, spilled), the same number of new chats
beside it. Per chat: TTFT and TPOT ((last token - first token) / (tokens - 1), vLLM's
bench definition); the long request's decode rate while the chats ran and after. Goal:
chat TPOT p50 beside the long request <= 1.5x gpu-only's chats alone. Writes
OUT/fairness.json and each server's log.

    benchmarks/gpu/fairness.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from host_extension import GIB, split_line, write_model

from vllm_offload.bench.server_process import ServerProcess


def token_times(
    base_url: str, prompt: list[int], max_tokens: int, seen: list[tuple[float, int]] | None = None
) -> dict[str, Any]:
    """One streamed greedy completion of exactly max_tokens: (perf_counter, tokens so
    far) at each chunk that brought tokens, appended to ``seen`` as they come (a chunk
    may carry several: vLLM's usage count says how many), or the server's refusal."""
    began, seen = time.perf_counter(), [] if seen is None else seen
    body = {
        "model": "m",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    with (
        httpx.Client(base_url=base_url, timeout=1800) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        if response.status_code != 200:
            return {"began": began, "seen": seen, "refused": response.read().decode()[:300]}
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                usage = json.loads(line[6:]).get("usage") or {}
                tokens = usage.get("completion_tokens") or 0
                if tokens > (seen[-1][1] if seen else 0):
                    seen.append((time.perf_counter(), tokens))
    return {"began": began, "seen": seen}


def chat_figures(answer: dict[str, Any]) -> dict[str, float]:
    """TTFT, and TPOT as vLLM's bench has it: (last token - first) / (tokens - 1)."""
    (first, _), (last, tokens) = answer["seen"][0], answer["seen"][-1]
    return {"ttft_s": first - answer["began"], "tpot_s": (last - first) / (tokens - 1)}


def tokens_by(seen: list[tuple[float, int]], moment: float) -> int:
    return max((n for t, n in seen if t <= moment), default=0)


def run_chats(base_url: str, prompts: list[list[int]], out_tokens: int) -> list[dict[str, float]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(lambda p: token_times(base_url, p, out_tokens), prompts))
    return [chat_figures(a) for a in answers]


def beside_long(
    base_url: str, long_prompt: list[int], long_out: int, chats: list[list[int]], chat_out: int
) -> dict[str, Any]:
    """The long request streamed in a thread; the chats once its first token is out
    (it is decoding, its KV in host RAM); its decode rate while they ran and after."""
    seen: list[tuple[float, int]] = []
    holder: dict[str, Any] = {}
    began = time.perf_counter()
    thread = threading.Thread(
        target=lambda: holder.update(token_times(base_url, long_prompt, long_out, seen))
    )
    thread.start()
    while thread.is_alive() and not seen:
        time.sleep(0.02)
    if not seen:
        thread.join()
        return {"long_refused": holder.get("refused", "no token")}
    ttft = seen[0][0] - began
    chats_began = time.perf_counter()
    figures = run_chats(base_url, chats, chat_out)
    chats_ended = time.perf_counter()
    thread.join()
    during = tokens_by(seen, chats_ended) - tokens_by(seen, chats_began)
    (last, total) = seen[-1]
    after = total - tokens_by(seen, chats_ended)
    return {
        "chats": figures,
        "long_ttft_s": ttft,
        "long_tokens": total,
        "long_tokens_during_chats": during,
        "chats_window_s": chats_ended - chats_began,
        "long_tok_per_s_during_chats": during / (chats_ended - chats_began),
        "long_tok_per_s_after": after / (last - chats_ended) if after > 1 else None,
    }


def percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]  # noqa: E731
    return {
        "p50": statistics.median(ordered),
        "p95": at(0.95),
        "min": ordered[0],
        "max": ordered[-1],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pool-gib", type=float, default=2.0)
    parser.add_argument("--extension-gib", type=float, default=8.0)
    parser.add_argument("--long-tokens", type=int, default=40000)
    parser.add_argument("--long-out", type=int, default=300)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--chat-in", type=int, default=512)
    parser.add_argument("--chat-out", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shares", default="0.25")
    parser.add_argument("--utilization", type=float, default=0.3, help="per server")
    parser.add_argument("--chunk-tokens", type=int, default=8192, help="gpu.prefill_chunk_tokens")
    parser.add_argument("--arms", help="a comma-separated subset (default: all)")
    parser.add_argument("--model", type=Path, help="a model folder (default: the 8B shape)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = args.model or write_model(Path("/tmp/fairness-model"), None)
    pool = ["--gpu-kv-cache-memory-bytes", str(int(args.pool_gib * GIB))]
    extended = [*pool, "--kv-offload-host-extension-gib", str(args.extension_gib)]
    flags = {"gpu-only": pool, "share-1": [*extended, "--kv-offload-spilled-step-share", "1"]}
    for share in args.shares.split(","):
        flags[f"share-{share}"] = [*extended, "--kv-offload-spilled-step-share", share]
    arms = args.arms.split(",") if args.arms else list(flags)

    def serve_args(name: str) -> list[str]:
        return [
            "--model",
            str(model),
            "--gpu-memory-utilization",
            str(args.utilization),
            "--kv-offload-backend",
            "none",
            *flags[name],
            "--gpu-prefill-chunk-tokens",
            str(args.chunk_tokens),
            "--",
            "--load-format",
            "dummy",
        ]

    servers = {
        name: ServerProcess(serve_args=serve_args(name), log_path=args.out / f"{name}.log")
        for name in arms
    }
    result: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "arms": {name: {"flags": flags[name], "rounds": []} for name in arms},
    }

    def save() -> None:
        (args.out / "fairness.json").write_text(json.dumps(result, indent=1) + "\n")

    rng = random.Random(0)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]

    def prompt(tokens: int) -> list[int]:  # random ids: no prefix is shared
        return [rng.randrange(vocab // 100, vocab * 3 // 4) for _ in range(tokens)]

    try:
        for server in servers.values():
            server.start()
        for name, server in servers.items():
            arm = result["arms"][name]
            try:
                arm["healthy_s"] = server.wait_healthy(1200)
                arm["split"] = split_line(server.log_path.read_text(errors="replace"))
                run_chats(server.base_url, [prompt(args.chat_in)], 8)  # warm
            except Exception as exc:
                arm["error"] = repr(exc)
                print(name, "failed:", exc, flush=True)
        live = [n for n in arms if "error" not in result["arms"][n]]
        for index in range(args.rounds if live else 0):
            for name in live[index % len(live) :] + live[: index % len(live)]:
                url = servers[name].base_url
                chats = [prompt(args.chat_in) for _ in range(args.chats)]
                alone = run_chats(url, chats, args.chat_out)
                beside = beside_long(
                    url,
                    prompt(args.long_tokens),
                    args.long_out,
                    [prompt(args.chat_in) for _ in range(args.chats)],
                    args.chat_out,
                )
                result["arms"][name]["rounds"].append({"alone": alone, "beside": beside})
                print(name, "round", index, summary_of_round(alone, beside), flush=True)
                save()
    finally:
        for server in servers.values():
            server.stop()
    summarize(result)
    save()


def summary_of_round(alone: list[dict[str, float]], beside: dict[str, Any]) -> dict[str, Any]:
    tpot = lambda chats: statistics.median(c["tpot_s"] for c in chats)  # noqa: E731
    shown: dict[str, Any] = {"alone_tpot_p50_s": tpot(alone)}
    if "chats" in beside:
        shown |= {
            "beside_tpot_p50_s": tpot(beside["chats"]),
            "long_tok_per_s_during_chats": beside["long_tok_per_s_during_chats"],
        }
    else:
        shown["long_refused"] = beside["long_refused"][:80]
    return shown


def summarize(result: dict[str, Any]) -> None:
    """Per arm over all rounds: chat TTFT/TPOT percentiles alone and beside the long
    request, the long request's rates (median, min-max over rounds), and chat TPOT p50
    beside it against gpu-only's chats alone (the goal: <= 1.5)."""
    for arm in result["arms"].values():
        rounds = arm["rounds"]
        alone = [c for r in rounds for c in r["alone"]]
        beside = [c for r in rounds for c in r["beside"].get("chats", [])]
        arm["summary"] = {
            "alone_ttft_s": percentiles([c["ttft_s"] for c in alone]),
            "alone_tpot_s": percentiles([c["tpot_s"] for c in alone]),
            "beside_ttft_s": percentiles([c["ttft_s"] for c in beside]),
            "beside_tpot_s": percentiles([c["tpot_s"] for c in beside]),
        }
        for key in ("long_ttft_s", "long_tok_per_s_during_chats", "long_tok_per_s_after"):
            values = [r["beside"][key] for r in rounds if r["beside"].get(key) is not None]
            arm["summary"][key] = percentiles(values)
        refused = [r["beside"]["long_refused"] for r in rounds if "long_refused" in r["beside"]]
        if refused:
            arm["summary"]["long_refused"] = refused[0]
    base = result["arms"].get("gpu-only", {}).get("summary", {}).get("alone_tpot_s")
    for name, arm in result["arms"].items():
        beside = arm["summary"]["beside_tpot_s"]
        if base and beside:
            arm["summary"]["beside_tpot_p50_vs_gpu_only_alone"] = beside["p50"] / base["p50"]
        print(name, json.dumps(arm["summary"], indent=1), flush=True)


if __name__ == "__main__":
    main()
