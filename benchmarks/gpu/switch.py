#!/usr/bin/env python3
"""Several models on one GPU (issues #31, #58), through `vllm-offload serve` with --models
[[models]] of the same Llama-3-8B-shaped random checkpoint ("a", the default, "b", ...),
CUDA graphs on, 8 GiB GPU pools and 4 GiB CPU tiers. One arm a call (--idle sleep --level
1|2, or --idle stop; --host-copy keep|release; --deep-sleep; --layered-wake;
--weights-on-gpu-gib N); --arena 0 runs the sleeps with vLLM's own backend (vllm_offload's
plugin not loaded); --cache DIR gives the server its own compile caches there, emptied
first (a cold start). Writes
$OUT-style JSON:

  start_s      front door up to /health 200 (with sleep: every model started and put away
               once, then 'a' brought in): every model ready
  switches     each: a request for the next model (b, c, ..., a, ...), sent to its first
               token (the resident one put away, the other brought in, the prefill), and
               the front door's own put-away / bring-in times; the request is `same`'s
  rss          each engine's process tree (psutil RSS) and GPU memory (nvidia-smi) at each
               point, beside the front door's planned figures for its state (`ps`), and
               the GPU's used memory
  same         the same greedy request (64 token ids, 32 tokens, 5 logprobs a token) asked
               of each model at its first turn and again at each later switch, bringing it
               in (the first step after its wake): tokens and logprobs against that first
               answer ('a''s first asked after a warm-up, its weights whole) (weights restored from
               the sleep's copy, or read again at level 2); a control (the prompt with one
               token changed) shows the comparison is sensitive. Random weights make it
               mean something (dummy weights repeat one token); the arms' first answers
               compare across arms (level 2 reads the weights from the checkpoint)
  plan         `vllm-offload plan` for the config, beside the engines' RSS
  tier         a 4,000-token document read by 'a', then 'a' switched out and back: its
               TTFT again (a CPU-tier hit if the tier survived) against a new document's,
               and the CPU-tier hit tokens vLLM counted
  front_door   'a' resident: sequential TTFT and saturated throughput (48 clients, 512 in /
               64 out, 8 s windows), straight to the engine's socket vs through the front
               door, windows interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from kit.arms import cache_env
from kit.box import PROMPT_IDS, box_config, control, first_token, plan, serving, tokens
from kit.stream import compare_records, stream_record  # one greedy request, compared

REPO = Path(__file__).resolve().parents[2]
NAMES = ("a", "b", "c", "d")


def config_text(args: argparse.Namespace, port: int, run_dir: Path) -> str:
    # max_resident 1: both would fit together under 'auto' (the default since #43)
    residency: dict[str, str | int | float] = {
        "max_resident": 1,
        "host_copy": args.host_copy,
        "idle": args.idle,
        "sleep_level": args.level,
        "min_resident_s": 0.0,
        "deep_sleep": args.deep_sleep,
        "layered_wake": args.layered_wake,
        "asleep_weights_on_gpu_gib": args.weights_on_gpu_gib,
    }
    return box_config(
        checkpoint=args.checkpoint,
        port=port,
        run_dir=run_dir,
        pool_bytes=args.pool_bytes,
        tier_gib=args.tier_gib,
        vllm_args=args.vllm_arg,
        residency=residency,
        names=NAMES[: args.models],
    )


def rss(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.NoSuchProcess:
        return None


def gpu_bytes_by_pid() -> dict[int, int]:
    """Each process's GPU memory, from nvidia-smi (MiB); none without one."""
    if shutil.which("nvidia-smi") is None:
        return {}
    rows = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    found = {}
    for row in rows:
        pid, used = (part.strip() for part in row.split(","))
        found[int(pid)] = int(used) << 20
    return found


def engine_gpu(pid: int | None, by_pid: dict[int, int]) -> int | None:
    if pid is None:
        return None
    try:
        tree = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return None
    return sum(by_pid.get(p, 0) for p in tree)


def device_used_bytes() -> int | None:
    """The GPU's used memory, from nvidia-smi (MiB): what a checkpointed engine no longer
    holds shows here, not only in its own row."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return int(out) << 20 if out.isdigit() else None


def rss_now(run_dir: Path, when: str) -> dict[str, Any]:
    """Each engine's measured memory beside the front door's record of it (its state, the
    planned figures `ps` shows), and the GPU's used memory."""
    models = control(run_dir)["models"]
    by_pid = gpu_bytes_by_pid()
    return {
        "when": when,
        "device_used_bytes": device_used_bytes(),
        **{
            n: {
                "rss_bytes": rss(m["pid"]),
                "gpu_bytes": engine_gpu(m["pid"], by_pid),
                "front_door": m,
            }
            for n, m in models.items()
        },
    }


def alone_rss(port: int, when: str) -> dict[str, Any]:
    """One model's engine (`serve` with one model is vLLM itself: no front door to ask):
    the process tree of the one listening on ``port`` (vLLM may retitle its processes)."""
    pid = next(
        c.pid
        for c in psutil.net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    )
    return {
        "when": when,
        "device_used_bytes": device_used_bytes(),
        "a": {"rss_bytes": rss(pid), "gpu_bytes": engine_gpu(pid, gpu_bytes_by_pid())},
    }


SAME_PROMPT = 64  # token ids of the sameness request (seed 4242)
SAME_TOKENS = 32


def same_answer(port: int, model: str, prompt: list[int]) -> dict[str, Any]:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
        # logprobs from an engine with no tokenizer (--skip-tokenizer-init)
        return stream_record(http, prompt, SAME_TOKENS, model, {"return_tokens_as_token_ids": True})


async def switches(
    front: httpx.AsyncClient,
    port: int,
    run_dir: Path,
    models: int,
    count: int,
    same: dict[str, Any],
) -> list[dict[str, Any]]:
    out = []
    names = NAMES[:models]
    for k in range(count):
        model = names[(k + 1) % models]
        before = len(control(run_dir)["events"])
        # the request that brings it in is the one compared: its first step is the wake's
        answer = await asyncio.to_thread(same_answer, port, model, same["prompt"])
        ttft = answer["ttft_s"]
        events = control(run_dir)["events"][before:]
        reference = same["first"].setdefault(model, answer)
        out.append(
            {
                "to": model,
                "first_token_s": round(ttft, 4),
                "steps": [(e["text"], e["seconds"]) for e in events],
                "same": compare_records(answer, reference) | {"tokens": answer["tokens"][:8]},
            }
        )
        print(f"switch to {model}: {ttft * 1000:.0f} ms {out[-1]['steps']}", flush=True)
        print(f"  same as its first answer: {out[-1]['same']}", flush=True)
    return out


def hits(metrics: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:external_prefix_cache_hits_total") and 'model_name="a"' in line
    )


async def tier_survives(front: httpx.AsyncClient) -> dict[str, Any]:
    doc, fresh = tokens(4000, 7), tokens(4000, 8)
    await first_token(front, "a", doc)  # computed, stored in a's CPU tier
    await asyncio.sleep(2)  # the stores finish
    before = hits((await front.get("/metrics")).text)
    await first_token(front, "b", tokens(64, 9))  # 'a' put away (its tier kept?)...
    await first_token(front, "a", tokens(64, 10))  # ...and brought back
    again, _ = await first_token(front, "a", doc)
    new, _ = await first_token(front, "a", fresh)
    after = hits((await front.get("/metrics")).text)
    return {
        "doc_again_ttft_s": round(again, 4),
        "new_doc_ttft_s": round(new, 4),
        "cpu_tier_hit_tokens": after - before,
    }


async def saturate(
    client: httpx.AsyncClient, seconds: float, clients: int = 48
) -> dict[str, float]:
    ttfts: list[float] = []
    out_tokens = 0
    began = time.perf_counter()

    async def loop(i: int) -> None:
        nonlocal out_tokens
        k = 0
        while time.perf_counter() - began < seconds:
            ttft, got = await first_token(client, "a", tokens(512, i * 100000 + k), 64)
            ttfts.append(ttft)
            out_tokens += got
            k += 1

    await asyncio.gather(*(loop(i) for i in range(clients)))
    elapsed = time.perf_counter() - began
    return {
        "tokens_per_s": round(out_tokens / elapsed, 1),
        "ttft_p50_s": round(statistics.median(ttfts), 4),
        "requests": len(ttfts),
    }


async def front_door_cost(
    front: httpx.AsyncClient, engine: httpx.AsyncClient, windows: int, clients: int
) -> dict[str, Any]:
    arms: dict[str, dict[str, list[Any]]] = {"direct": {}, "front": {}}
    for w in range(windows):
        for name, client in (("direct", engine), ("front", front))[:: 1 if w % 2 else -1]:
            seq = [
                (await first_token(client, "a", tokens(512, 50000 + w * 100 + i), 1))[0]
                for i in range(10)
            ]
            arms[name].setdefault("sequential_ttft_s", []).append(statistics.median(seq))
            arms[name].setdefault("saturated", []).append(await saturate(client, 8, clients))
            print(
                f"window {w} {name}: seq {statistics.median(seq) * 1000:.2f} ms "
                f"{arms[name]['saturated'][-1]}",
                flush=True,
            )
    return arms


async def measure(
    args: argparse.Namespace, port: int, run_dir: Path, result: dict[str, Any]
) -> None:
    front = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600)
    if args.models == 1:  # vLLM serves it alone: no front door, no control socket
        result["first_token_s"] = (await first_token(front, "a", tokens(64, 1)))[0]
        await front.aclose()
        result["rss"] = [alone_rss(port, "after start")]
        return
    result["rss"] = [rss_now(run_dir, "after start")]
    await first_token(front, "a", tokens(64, 1))
    prompt = tokens(SAME_PROMPT, 4242)
    first = same_answer(port, "a", prompt)
    changed = [*prompt[:32], prompt[32] + 1, *prompt[33:]]
    result["same"] = same = {
        "prompt": prompt,
        "first": {"a": first},
        "control": compare_records(same_answer(port, "a", changed), first),
    }
    print(f"control (one prompt token changed): {same['control']}", flush=True)
    result["switches"] = await switches(front, port, run_dir, args.models, args.switches, same)
    same["a_vs_b"] = compare_records(same["first"]["a"], same["first"]["b"])
    result["rss"].append(rss_now(run_dir, f"after {args.switches} switches"))
    if args.idle == "sleep":
        result["tier"] = await tier_survives(front)
        print("tier:", result["tier"], flush=True)
    if args.front_windows:
        await first_token(front, "a", tokens(64, 2))
        socket = run_dir / "engines" / "0.sock"
        engine = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket)),
            base_url="http://engine",
            timeout=600,
        )
        result["front_door"] = await front_door_cost(
            front, engine, args.front_windows, args.clients
        )
        await engine.aclose()
    await front.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--idle", choices=["sleep", "stop"], default="sleep")
    parser.add_argument("--level", type=int, choices=[1, 2], default=1)
    parser.add_argument("--arena", type=int, choices=[0, 1], default=1)
    parser.add_argument("--models", type=int, choices=range(1, len(NAMES) + 1), default=2)
    parser.add_argument("--host-copy", choices=["keep", "release"], default="keep")
    parser.add_argument("--deep-sleep", action="store_true", help="residency.deep_sleep = true")
    parser.add_argument("--layered-wake", action="store_true", help="residency.layered_wake = true")
    parser.add_argument(
        "--weights-on-gpu-gib", type=float, default=0.0, help="residency.asleep_weights_on_gpu_gib"
    )
    parser.add_argument("--cache", type=Path, help="the server's compile caches, emptied")
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--front-windows", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--start-timeout", type=float, default=400)
    parser.add_argument("--pool-bytes", type=int, default=8 << 30)
    parser.add_argument("--tier-gib", type=float, default=4)
    parser.add_argument("--clients", type=int, default=48, help="saturated windows' clients")
    parser.add_argument("--vocab-high", type=int, default=30000)
    parser.add_argument("--vllm-arg", action="append", default=[], help="e.g. --enforce-eager")
    args = parser.parse_args()
    PROMPT_IDS[1] = args.vocab_high
    name = f"{args.idle}{args.level if args.idle == 'sleep' else ''}-arena{args.arena}"
    name += f"-{args.models}models-{args.host_copy}"
    name += "-layered" if args.layered_wake else ""
    name += f"-gpu{args.weights_on_gpu_gib:g}" if args.weights_on_gpu_gib else ""
    run_dir = Path(f"/tmp/vllm-offload-switch/run-{name}")
    config = run_dir.parent / f"{name}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(config_text(args, args.port, run_dir))
    env = dict(os.environ)
    if not args.arena:
        env["VLLM_PLUGINS"] = "none"  # vLLM's own sleep backend
    if args.cache:
        shutil.rmtree(args.cache, ignore_errors=True)
        env.update(cache_env(args.cache))
    log = args.out.with_suffix(".log")
    result: dict[str, Any] = {"arm": name, "config": config.read_text()}
    planned = plan(config, env=env)
    result["plan"] = planned.stdout + planned.stderr
    try:
        with serving(config, log, args.port, args.start_timeout, env) as start_s:
            result["start_s"] = start_s
            print(f"{name}: healthy in {start_s} s", flush=True)
            asyncio.run(measure(args, args.port, run_dir, result))
            if args.models > 1:  # the front door's record of every step
                result["events"] = control(run_dir)["events"]
    except Exception as exc:  # write what there is, say what broke
        result["error"] = repr(exc)
        print("error:", repr(exc), flush=True)
    finally:
        args.out.write_text(json.dumps(result, indent=2))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
