"""Arms x workloads x repeats: servers started through the launcher, runs interleaved."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from vllm_offload.bench import prompts, reuse, workloads
from vllm_offload.bench.options import Arm, BenchOptions
from vllm_offload.bench.server_process import GIB, ServerProcess, split_serve_args
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import compute_dtype_bytes, kv_bytes_per_token


def arm_args(options: BenchOptions, arm: Arm) -> list[str]:
    args = ["--model", str(options.model)]
    if arm.kind == "baseline":
        args += ["--kv-offload-backend", "none"]
    else:
        args += [
            "--kv-offload-backend",
            arm.kind,
            "--kv-offload-cpu-tier-gib",
            str(options.tier_gib),
        ]
    if options.pool_bytes is not None:
        args += ["--gpu-kv-cache-memory-bytes", str(options.pool_bytes)]
    if options.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", str(options.gpu_memory_utilization)]
    ours, _, theirs = split_serve_args(list(arm.flags))
    return [*args, *options.serve_flags, *ours, "--", *options.vllm_args, *theirs]


def available_arms(arms: list[Arm]) -> tuple[list[Arm], dict[str, str]]:
    skipped = {}
    if importlib.util.find_spec("lmcache") is None:
        for arm in arms:
            if arm.kind == "lmcache":
                skipped[arm.label] = "LMCache is not installed (pip install lmcache)"
    return [a for a in arms if a.label not in skipped], skipped


def _progress_bar(total: int) -> Any:
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="bench", unit="step")
    except ImportError:  # a plain counter where tqdm is missing
        return None


def run(options: BenchOptions) -> dict[str, Any]:
    options.out.mkdir(parents=True, exist_ok=True)
    arms, skipped = available_arms(options.arms)
    facts = model_facts.read(options.model)
    per_token = kv_bytes_per_token(facts, compute_dtype_bytes(facts, "auto"))
    maker = prompts.PromptMaker(
        token_ids=options.token_ids, vocab_high=facts.vocab_size or prompts.TOKEN_HIGH
    )
    steps_per_arm = (
        ("reuse" in options.workloads) * (2 * options.docs + len(options.hit_concurrency))
        + ("chat" in options.workloads) * options.conversations * options.turns
        + ("sweep" in options.workloads) * len(options.rates)
        + ("decode" in options.workloads)
    )
    bar = _progress_bar(options.repeats * len(arms) * steps_per_arm)

    def tick() -> None:
        if bar is not None:
            bar.update(1)

    # The bursts drop the GPU prefix cache through vLLM's dev route.
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"} if options.hit_concurrency else None
    servers = {
        arm.label: ServerProcess(
            serve_args=arm_args(options, arm), log_path=options.out / f"{arm.label}.log", env=env
        )
        for arm in arms
    }
    results: dict[str, Any] = {
        "options": _jsonable(options),
        "skipped_arms": skipped,
        "kv_bytes_per_token": per_token,
        "arms": {},
    }
    try:
        for server in servers.values():  # started together: one start-up wait for all
            server.start()
        for arm, server in servers.items():
            server.wait_healthy()
            results["arms"][arm] = {
                "memory": {
                    "healthy_s": round(server.healthy_s or 0.0, 2),
                    "host_ram_gib": round(server.host_ram_bytes() / GIB, 3),
                    **server.log_facts(),
                },
                "runs": [],
            }
        labels = list(servers)
        for repeat in range(options.repeats):
            order = labels[repeat % len(labels) :] + labels[: repeat % len(labels)]  # interleaved
            for arm in order:
                if "failed" in results["arms"][arm]:
                    continue
                url = servers[arm].base_url
                run_result: dict[str, Any] = {"repeat": repeat, "started": time.time()}
                try:
                    turn = workloads.Repeat(base_url=url, maker=maker, seed=repeat, progress=tick)
                    run_workloads(options, turn, run_result)
                except httpx.HTTPError as exc:
                    # Its server stopped answering (an engine that died): that arm ends
                    # here with what it measured, the others go on.
                    results["arms"][arm]["failed"] = failure(servers[arm], repeat, exc)
                    print(
                        f"bench: arm {arm} failed: {results['arms'][arm]['failed']}",
                        file=sys.stderr,
                    )
                    continue
                results["arms"][arm]["runs"].append(run_result)
            # What is measured so far survives a run cut short (a GPU call's time limit).
            (options.out / "results.partial.json").write_text(json.dumps(results, indent=1))
    finally:
        for server in servers.values():
            server.stop()
        if bar is not None:
            bar.close()
    results["floor"] = cpu_hit_floor(results, per_token, options)
    results["decode_floor"] = decode_floor(results, options)
    return results


EXIT_AFTER_ERROR_S = 10.0  # a server killed with its engine drops the connection first


def failure(server: ServerProcess, repeat: int, exc: httpx.HTTPError) -> str:
    """What ended an arm: the error, and its server's exit code if it exited."""
    code = None
    if server.proc is not None:
        try:  # a reset connection can arrive before its killed server has exited
            code = server.proc.wait(timeout=EXIT_AFTER_ERROR_S)
        except subprocess.TimeoutExpired:
            code = None  # still serving: the error was the request's own
    exited = f"; its server exited with code {code}" if code is not None else ""
    return f"repeat {repeat}: {type(exc).__name__}: {exc}{exited} (log: {server.log_path})"


def run_workloads(
    options: BenchOptions, repeat: workloads.Repeat, run_result: dict[str, Any]
) -> None:
    """One arm's turn in one repeat: each chosen workload, into ``run_result``."""
    if "reuse" in options.workloads:
        run_result["reuse"] = reuse.reuse(
            repeat,
            docs=options.docs,
            doc_tokens=options.doc_tokens,
            settle_s=options.settle_s,
            hit_concurrency=tuple(options.hit_concurrency),
        )
    if "chat" in options.workloads:
        run_result["chat"] = workloads.chat(
            repeat,
            conversations=options.conversations,
            turns=options.turns,
            turn_tokens=options.turn_tokens,
            output_tokens=options.output_tokens,
        )
    if "sweep" in options.workloads:
        run_result["sweep"] = workloads.sweep(
            repeat,
            rates=options.rates,
            seconds=options.rate_seconds,
            prompt_tokens=options.prompt_tokens,
            output_tokens=options.output_tokens,
            max_concurrency=options.max_concurrency,
        )
    if "decode" in options.workloads:
        run_result["decode"] = workloads.decode(
            repeat,
            batch=options.decode_batch,
            prompt_tokens=options.prompt_tokens,
            output_tokens=options.output_tokens,
        )


def decode_floor(results: dict[str, Any], options: BenchOptions) -> dict[str, Any]:
    """Per arm with offloaded weights: the decode speed it cannot beat, when every step
    moves all offloaded bytes over the host->GPU link once (batch x bandwidth / bytes)."""
    floors: dict[str, Any] = {}
    for arm, data in results["arms"].items():
        memory = data["memory"]
        gib = memory.get("offloaded_gib")
        gb = memory.get("prefetch_offloaded_gb")
        offloaded = gib * GIB if gib else gb * 1e9 if gb else None
        if offloaded and options.h2d_gbps:
            floors[arm] = {
                "offloaded_bytes": offloaded,
                "step_transfer_s": offloaded / (options.h2d_gbps * 1e9),
                "ceiling_tok_per_s": options.decode_batch * options.h2d_gbps * 1e9 / offloaded,
            }
    return floors


def cpu_hit_floor(results: dict[str, Any], per_token: int, options: BenchOptions) -> dict[str, Any]:
    """TTFT a CPU-tier hit cannot beat: the GPU-hit TTFT plus moving the document's KV
    over the host->GPU link at the measured bandwidth."""
    doc_bytes = per_token * options.doc_tokens
    floor: dict[str, Any] = {"doc_kv_bytes": doc_bytes, "h2d_gbps": options.h2d_gbps}
    gpu_hits = [
        run["reuse"]["gpu_hit_ttft_s"]
        for arm in results["arms"].values()
        for run in arm["runs"]
        if "reuse" in run and run["reuse"]["gpu_hit_ttft_s"]
    ]
    if gpu_hits:
        floor["gpu_hit_ttft_s"] = min(gpu_hits)
        if options.h2d_gbps:
            floor["transfer_s"] = doc_bytes / (options.h2d_gbps * 1e9)
            floor["cpu_hit_floor_s"] = floor["gpu_hit_ttft_s"] + floor["transfer_s"]
    return floor


def _jsonable(options: BenchOptions) -> dict[str, Any]:
    data = asdict(options)
    data["arms"] = [
        {"label": a.label, "kind": a.kind, "flags": list(a.flags)} for a in options.arms
    ]
    return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}
