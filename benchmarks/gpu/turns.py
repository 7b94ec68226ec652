#!/usr/bin/env python3
"""Issue #43 (1b, 1c): the trade between switch rate and waiting, on the GPU, through
`vllm-offload serve` with two [[models]] ("a", "b") of one checkpoint (switch.py's config:
token ids, fixed GPU pools, CPU tiers). Each arm its own server:

  auto      max_resident "auto": both fit together on a big card (the planner says so
            in `plan`, kept here): no switch expected
  turnN     max_resident 1, min_resident_s N (turn0, turn5, turn15, ...)

Load per arm (issue #43's): --people per model (1: issue #43's two people) for --run-s,
each sending a --prompt-tokens prompt for a --answer-tokens answer (greedy, ignore_eos,
min_tokens) and reading --think-s after it; one request per model first, outside the
window (warm-up).
Per request: model, when sent (from the window's start), TTFT, total, stream chunks. The
switches: the front door's events in the window (control socket, read every few seconds),
each bring-in with the put-away that made room for it. Writes OUT/turns-ARM.json (raw +
summary) and prints a table. Arms run one after another; an arm that would not end inside
--budget-s (judged by the longest arm so far) is skipped, so a bounded call keeps what
finished.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit.box import PROMPT_IDS, box_config, control, first_token, plan, serving, tokens
from kit.stream import nearest_rank

ARM = re.compile(r"auto|turn(\d+(?:\.\d+)?)")
POLL_S = 5.0  # the control socket keeps its last 200 events; read them this often


def residency(arm: str, args: argparse.Namespace) -> dict[str, str | int | float]:
    found = ARM.fullmatch(arm)
    if found is None:
        raise ValueError(f"--arms: '{arm}' is not an arm; give auto or turnN (N: seconds)")
    settings: dict[str, str | int | float] = {"idle": args.idle, "sleep_level": args.level}
    if found.group(1) is None:
        return {"max_resident": "auto", **settings}
    return {"max_resident": 1, "min_resident_s": float(found.group(1)), **settings}


def planned(config: Path) -> dict[str, Any]:
    """`vllm-offload plan --json`: max_resident as resolved, the set's decisions."""
    done = plan(config, "--json")
    try:
        printed = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"exit": done.returncode, "stderr": done.stderr[-2000:]}
    keys = ("max_resident", "decisions", "warnings", "problems")
    each = ("gpu_budget_bytes", "weights_gpu_bytes", "gpu_kv_pool_bytes", "max_model_len")
    models = {n: {k: m.get(k) for k in each} for n, m in printed["models"].items()}
    return {"exit": done.returncode, **{k: printed[k] for k in keys}, "models": models}


async def ask(
    front: httpx.AsyncClient, model: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    sent = time.perf_counter()
    row: dict[str, Any] = {"model": model}
    try:
        ttft, got = await first_token(
            front, model, tokens(args.prompt_tokens, seed), args.answer_tokens
        )
        row.update(ttft_s=round(ttft, 4), chunks=got)  # a chunk may carry several tokens
    except (httpx.HTTPError, AssertionError) as exc:  # a 503 (queue full), a broken stream
        row["error"] = repr(exc)[:300]
    row["total_s"] = round(time.perf_counter() - sent, 4)
    return row


async def load(run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Everyone for --run-s (each finishes the request under way), the events seen."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{args.port}", timeout=600) as front:
        return await people(front, run_dir, args)


async def people(
    front: httpx.AsyncClient, run_dir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    warmup = await asyncio.gather(*(ask(front, m, 900_000 + i, args) for i, m in enumerate("ab")))
    events: dict[tuple[float, str], dict[str, Any]] = {}
    requests: list[dict[str, Any]] = []
    began, began_wall = time.perf_counter(), time.time()

    async def person(index: int, model: str) -> None:
        k = 0
        while time.perf_counter() - began < args.run_s:
            sent = time.perf_counter() - began
            requests.append(
                {"sent_s": round(sent, 3), **await ask(front, model, index * 100_000 + k, args)}
            )
            k += 1
            await asyncio.sleep(args.think_s)

    async def watch() -> None:
        while True:
            for e in (await asyncio.to_thread(control, run_dir))["events"]:
                if e["t"] >= began_wall:
                    events[(e["t"], e["text"])] = e
            await asyncio.sleep(POLL_S)

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(person(i, m) for i, m in enumerate("ab" * args.people)))
    ended = time.perf_counter() - began
    watcher.cancel()
    for e in control(run_dir)["events"]:
        if e["t"] >= began_wall:
            events[(e["t"], e["text"])] = e
    seen = sorted(events.values(), key=lambda e: e["t"])
    for e in seen:
        e["at_s"] = round(e["t"] - began_wall, 3)
    return {"warmup": warmup, "window_s": round(ended, 2), "requests": requests, "events": seen}


def switches(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each bring-in in the window, with the put-away just before it (None: a free place)."""
    out, away = [], None
    for e in events:
        if e.get("step") == "put-away":
            away = e
        elif e.get("step") == "bring-in":
            put = None if away is None else {"model": away["model"], "s": away["seconds"]}
            out.append(
                {"at_s": e["at_s"], "to": e["model"], "bring_in_s": e["seconds"], "put_away": put}
            )
            away = None
    return out


def summary(measured: dict[str, Any]) -> dict[str, Any]:
    moves = measured["switches"]
    minutes = measured["window_s"] / 60
    out: dict[str, Any] = {
        "switches": len(moves),
        "switches_per_min": round(len(moves) / minutes, 1),
        "bring_in_s_median": _median([m["bring_in_s"] for m in moves]),
        "put_away_s_median": _median([m["put_away"]["s"] for m in moves if m["put_away"]]),
        "failures": [e["text"] for e in measured["events"] if e.get("step") is None],
    }
    for model in ("a", "b", "all"):
        rows = [r for r in measured["requests"] if model in (r["model"], "all")]
        ttft = [r["ttft_s"] for r in rows if "ttft_s" in r]
        out[model] = {
            "requests": len(ttft),
            "errors": len(rows) - len(ttft),
            "ttft_p50_s": round(statistics.median(ttft), 4) if ttft else None,
            "ttft_p95_s": nearest_rank(ttft, 0.95) if ttft else None,
            "ttft_max_s": max(ttft, default=None),
            "total_p50_s": _median([r["total_s"] for r in rows if "ttft_s" in r]),
        }
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(f"/tmp/vllm-offload-turns/run-{arm}")
    config = run_dir.parent / f"{arm}.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        box_config(
            checkpoint=args.checkpoint,
            port=args.port,
            run_dir=run_dir,
            pool_bytes=args.pool_bytes,
            tier_gib=args.tier_gib,
            vllm_args=args.vllm_arg,
            residency=residency(arm, args),
        )
    )
    load_args = ("people", "run_s", "think_s", "prompt_tokens", "answer_tokens")
    result: dict[str, Any] = {
        "arm": arm,
        "config": config.read_text(),
        "load": {k: getattr(args, k) for k in load_args},
        "plan": planned(config),
    }
    print(f"{arm}: plan {json.dumps(result['plan'])}", flush=True)
    began = time.monotonic()
    try:
        with serving(config, args.out / f"turns-{arm}.log", args.port, args.start_timeout) as up:
            result["start_s"] = up
            print(f"{arm}: healthy in {up} s", flush=True)
            result.update(asyncio.run(load(run_dir, args)))
            result["switches"] = switches(result["events"])
            result["summary"] = summary(result)
    except Exception as exc:  # write what there is, say what broke
        result["error"] = repr(exc)
        print(f"{arm}: error: {exc!r}", flush=True)
    except SystemExit:  # SIGTERM (the call's timeout): the server stopped, what there is kept
        result["error"] = "stopped by SIGTERM"
        raise
    finally:
        result["arm_s"] = round(time.monotonic() - began, 1)  # the plan's second not counted
        (args.out / f"turns-{arm}.json").write_text(json.dumps(result, indent=2))
    return result


def table(results: list[dict[str, Any]]) -> str:
    """One line an arm: max_resident as planned, the window (until the last answer), the
    switches, the steps' medians, each model's requests and TTFT p50 / p95 / max."""
    lines = ["arm     resident  window s  switches /min  put-away / bring-in s  per model"]
    for r in results:
        s = r.get("summary")
        if s is None:
            lines.append(f"{r['arm']:<8}{r.get('error') or r.get('skipped')}")
            continue
        cells = [
            f"{m}: {s[m]['requests']} requests, TTFT {_ms(s[m]['ttft_p50_s'])} / "
            f"{_ms(s[m]['ttft_p95_s'])} / {_ms(s[m]['ttft_max_s'])}"
            + (f" ({s[m]['errors']} errors)" if s[m]["errors"] else "")
            for m in ("a", "b", "all")
        ]
        steps = f"{_ms(s['put_away_s_median'])} / {_ms(s['bring_in_s_median'])}"
        lines.append(
            f"{r['arm']:<8}{r['plan'].get('max_resident')!s:<10}{r['window_s']:<10.1f}"
            f"{s['switches']:<9}{s['switches_per_min']:<6}{steps:<23}" + "; ".join(cells)
        )
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--arms", default="auto,turn0,turn5,turn15", help="comma-separated")
    parser.add_argument("--out", type=Path, required=True, help="a folder")
    parser.add_argument("--run-s", type=float, default=60.0)
    parser.add_argument("--think-s", type=float, default=1.0)
    parser.add_argument("--people", type=int, default=1, help="people per model")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--answer-tokens", type=int, default=32)
    parser.add_argument("--idle", choices=["sleep", "stop"], default="sleep", help="CPU: stop")
    parser.add_argument("--level", type=int, choices=[1, 2], default=1, help="sleep level")
    parser.add_argument("--pool-bytes", type=int, default=4 << 30, help="each model's GPU pool")
    parser.add_argument("--tier-gib", type=float, default=4)
    parser.add_argument(
        "--vllm-arg", action="append", default=[], help="a vLLM flag: --vllm-arg=--enforce-eager"
    )
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--start-timeout", type=float, default=400)
    parser.add_argument("--budget-s", type=float, help="skip arms that would end past this")
    parser.add_argument("--vocab-high", type=int, default=30000)
    args = parser.parse_args()
    PROMPT_IDS[1] = args.vocab_high
    arms = args.arms.split(",")
    for arm in arms:  # every name checked before anything starts
        try:
            residency(arm, args)
        except ValueError as exc:
            parser.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout: servers stopped
    began, longest, results = time.monotonic(), 0.0, []
    for arm in arms:
        left = None if args.budget_s is None else args.budget_s - (time.monotonic() - began)
        if left is not None and left < max(longest, args.run_s) + 10:
            results.append({"arm": arm, "skipped": f"{left:.0f} s left, an arm took {longest} s"})
            print(f"{arm}: skipped ({results[-1]['skipped']})", flush=True)
            continue
        results.append(run_arm(arm, args))
        longest = max(longest, results[-1]["arm_s"] + 10)
        print(table(results[-1:]), flush=True)
    print(table(results), flush=True)
    return 1 if any("summary" not in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
