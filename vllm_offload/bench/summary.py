"""Bench results summarized: one row per arm and metric, its median and spread over the
repeats (and, per burst size, the CPU hits against their floor)."""

from __future__ import annotations

import statistics
from typing import Any


def _spread(values: list[float | None]) -> dict[str, float | None]:
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def rate_label(rate: float | str | None) -> str:
    if rate is None:
        return "sync"
    return rate if isinstance(rate, str) else f"{rate:g}rps"


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm and metric, across repeats: median, min, max (the spread)."""
    rows: list[dict[str, Any]] = []
    for arm, data in results["arms"].items():
        runs = data["runs"]
        arm_rows = memory_rows(data["memory"])
        if runs and "reuse" in runs[0]:
            arm_rows += reuse_rows(runs, results["options"].get("h2d_gbps"))
        if runs and "chat" in runs[0]:
            arm_rows += chat_rows(runs)
        if runs and "sweep" in runs[0]:
            arm_rows += sweep_rows(runs)
        if runs and "decode" in runs[0]:
            ceiling = results.get("decode_floor", {}).get(arm, {}).get("ceiling_tok_per_s")
            arm_rows += decode_rows(runs, ceiling)
        rows += [{"arm": arm, **row} for row in arm_rows]
    return rows


def _row(metric: str, unit: str, values: list[float | None]) -> dict[str, Any]:
    return {"metric": metric, "unit": unit, **_spread(values)}


def memory_rows(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """What the server took at start-up (one value each: the spread is that value)."""
    keys = ("healthy_s", "host_ram_gib", "tier_registered_s", "kv_cache_tokens")
    return [_row(f"memory.{key}", "", [memory[key]]) for key in keys if memory.get(key) is not None]


def reuse_rows(runs: list[dict[str, Any]], h2d_gbps: float | None) -> list[dict[str, Any]]:
    """TTFT by pass, the server's side of each pass per document, the GPU-hit TTFT, then
    the bursts."""
    rows = [
        _row(f"reuse.ttft_pass{i + 1}", "s", [r["reuse"]["ttft_pass_s"][i] for r in runs])
        for i in range(2)
    ]
    for i in range(2):  # the server's side of each pass, per document
        for name in runs[0]["reuse"].get("server_per_doc", [{}, {}])[i]:
            short = name.removeprefix("vllm:").removesuffix("_seconds_sum")
            unit = "bytes" if name.endswith("_bytes") else "s"
            values = [r["reuse"]["server_per_doc"][i].get(name) for r in runs]
            rows.append(_row(f"reuse.pass{i + 1}.server.{short}", unit, values))
    hits = [r["reuse"]["gpu_hit_ttft_s"] for r in runs if r["reuse"]["gpu_hit_ttft_s"]]
    rows.append(_row("reuse.gpu_hit_ttft", "s", hits))
    return rows + burst_rows(runs, h2d_gbps)


def chat_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    turns = len(runs[0]["chat"]["ttft_by_turn_s"])
    return [
        _row(f"chat.ttft_turn{t + 1}", "s", [r["chat"]["ttft_by_turn_s"][t] for r in runs])
        for t in range(turns)
    ]


SWEEP_UNITS = (
    ("output_tok_per_s", "tok/s"),
    ("ttft_p50_s", "s"),
    ("ttft_mean_s", "s"),
    ("ttft_p99_s", "s"),
    ("tpot_p50_s", "s"),
    ("tpot_p99_s", "s"),
    ("errors", ""),
)


def sweep_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for i, row in enumerate(runs[0]["sweep"]):
        label = rate_label(row["rate_rps"])
        for key, unit in SWEEP_UNITS:
            values = [v for r in runs if (v := r["sweep"][i].get(key)) is not None]
            rows.append(_row(f"sweep.{label}.{key}", unit, values))
    return rows


def decode_rows(runs: list[dict[str, Any]], ceiling: float | None) -> list[dict[str, Any]]:
    """Decode speed and TPOT, and the host->GPU ceiling of the offloaded weights if any."""
    rows = []
    for key, unit in (("decode_tok_per_s", "tok/s"), ("tpot_p50_s", "s")):
        values = [r["decode"][key] for r in runs if r["decode"][key] is not None]
        rows.append(_row(f"decode.{key}", unit, values))
    if ceiling:
        rows.append(_row("decode.ceiling_tok_per_s", "tok/s", [ceiling]))
    return rows


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def burst_facts(burst: dict[str, Any], h2d_gbps: float | None) -> dict[str, float | None]:
    """One burst of CPU hits against its floor: the median GPU-hit TTFT of the same
    documents read at once, plus every byte the CPU hits loaded over the link."""
    cpu = _median(burst["cpu_hit"]["ttft_s"])
    gpu = _median(burst["gpu_hit"]["ttft_s"])
    server = burst["cpu_hit"]["server"]
    loaded = server.get("vllm:kv_offload_load_bytes") or 0.0
    floor = gpu + loaded / (h2d_gbps * 1e9) if gpu is not None and h2d_gbps else None
    n = burst["concurrency"]
    return {
        "cpu_hit_ttft": cpu,
        "gpu_hit_ttft": gpu,
        "cpu_over_gpu": cpu / gpu if cpu and gpu else None,
        "load_bytes": loaded,
        "load_gbps": burst.get("load_gbps"),
        "load_share_of_link": burst["load_gbps"] / h2d_gbps
        if burst.get("load_gbps") and h2d_gbps
        else None,
        "floor": floor if loaded else None,
        "cpu_over_floor": cpu / floor if cpu and floor and loaded else None,
        "queue_per_request": (server.get("vllm:request_queue_time_seconds_sum") or 0.0) / n,
        "prefill_per_request": (server.get("vllm:request_prefill_time_seconds_sum") or 0.0) / n,
    }


BURST_UNITS = {
    "load_bytes": "bytes",
    "load_gbps": "GB/s",
    "cpu_over_gpu": "x",
    "load_share_of_link": "x",
    "cpu_over_floor": "x",
}


def burst_rows(runs: list[dict[str, Any]], h2d_gbps: float | None) -> list[dict[str, Any]]:
    """Per burst size N: every request's TTFT (CPU hits, GPU hits) over all bursts of that
    size, then each burst's medians and floor, spread over the bursts."""
    by_size: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        for burst in run["reuse"].get("bursts", []):
            by_size.setdefault(burst["concurrency"], []).append(burst)
    rows: list[dict[str, Any]] = []
    for n, bursts in sorted(by_size.items()):
        for phase in ("cpu_hit", "gpu_hit"):
            every = [t for b in bursts for t in b[phase]["ttft_s"]]
            rows.append(
                {"metric": f"burst{n}.{phase}_ttft.requests", "unit": "s", **_spread(every)}
            )
        facts = [burst_facts(b, h2d_gbps) for b in bursts]
        for key in facts[0]:
            rows.append(
                {
                    "metric": f"burst{n}.{key}",
                    "unit": BURST_UNITS.get(key, "s"),
                    **_spread([f[key] for f in facts]),
                }
            )
    return rows
