"""Bench results as JSON (everything), CSV and Markdown (summaries) and PNG plots."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
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
        memory = data["memory"]
        for key in ("healthy_s", "host_ram_gib", "tier_registered_s", "kv_cache_tokens"):
            if memory.get(key) is not None:
                rows.append(
                    {"arm": arm, "metric": f"memory.{key}", "unit": "", **_spread([memory[key]])}
                )
        if runs and "reuse" in runs[0]:
            for i in range(2):
                rows.append(
                    {
                        "arm": arm,
                        "metric": f"reuse.ttft_pass{i + 1}",
                        "unit": "s",
                        **_spread([r["reuse"]["ttft_pass_s"][i] for r in runs]),
                    }
                )
            for i in range(2):  # the server's side of each pass, per document
                for name in runs[0]["reuse"].get("server_per_doc", [{}, {}])[i]:
                    short = name.removeprefix("vllm:").removesuffix("_seconds_sum")
                    unit = "bytes" if name.endswith("_bytes") else "s"
                    values = [r["reuse"]["server_per_doc"][i].get(name) for r in runs]
                    rows.append(
                        {
                            "arm": arm,
                            "metric": f"reuse.pass{i + 1}.server.{short}",
                            "unit": unit,
                            **_spread(values),
                        }
                    )
            hits = [r["reuse"]["gpu_hit_ttft_s"] for r in runs if r["reuse"]["gpu_hit_ttft_s"]]
            rows.append({"arm": arm, "metric": "reuse.gpu_hit_ttft", "unit": "s", **_spread(hits)})
            h2d = results["options"].get("h2d_gbps")
            rows += [{"arm": arm, **row} for row in burst_rows(runs, h2d)]
        if runs and "chat" in runs[0]:
            turns = len(runs[0]["chat"]["ttft_by_turn_s"])
            for t in range(turns):
                rows.append(
                    {
                        "arm": arm,
                        "metric": f"chat.ttft_turn{t + 1}",
                        "unit": "s",
                        **_spread([r["chat"]["ttft_by_turn_s"][t] for r in runs]),
                    }
                )
        if runs and "sweep" in runs[0]:
            for i, row in enumerate(runs[0]["sweep"]):
                label = rate_label(row["rate_rps"])
                for key, unit in (
                    ("output_tok_per_s", "tok/s"),
                    ("ttft_p50_s", "s"),
                    ("ttft_mean_s", "s"),
                    ("ttft_p99_s", "s"),
                    ("tpot_p50_s", "s"),
                    ("tpot_p99_s", "s"),
                    ("errors", ""),
                ):
                    values = [v for r in runs if (v := r["sweep"][i].get(key)) is not None]
                    rows.append(
                        {
                            "arm": arm,
                            "metric": f"sweep.{label}.{key}",
                            "unit": unit,
                            **_spread(values),
                        }
                    )
        if runs and "decode" in runs[0]:
            for key, unit in (("decode_tok_per_s", "tok/s"), ("tpot_p50_s", "s")):
                values = [r["decode"][key] for r in runs if r["decode"][key] is not None]
                rows.append(
                    {"arm": arm, "metric": f"decode.{key}", "unit": unit, **_spread(values)}
                )
            ceiling = results.get("decode_floor", {}).get(arm, {}).get("ceiling_tok_per_s")
            if ceiling:
                rows.append(
                    {
                        "arm": arm,
                        "metric": "decode.ceiling_tok_per_s",
                        "unit": "tok/s",
                        **_spread([ceiling]),
                    }
                )
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


def markdown(results: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:,.4g}"

    lines = [
        "# vllm-offload bench",
        "",
        f"Arms: {', '.join(results['arms'])}; repeats: {results['options']['repeats']}.",
        "",
    ]
    if results["skipped_arms"]:
        lines += [f"Skipped: {arm} ({why})" for arm, why in results["skipped_arms"].items()]
        lines.append("")
    failed = {arm: data["failed"] for arm, data in results["arms"].items() if "failed" in data}
    if failed:
        lines += [
            f"Failed: {arm}, {why}; its earlier repeats are below" for arm, why in failed.items()
        ]
        lines.append("")
    lines += ["| arm | metric | unit | median | min | max |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['arm']} | {r['metric']} | {r['unit']} | {num(r['median'])} | {num(r['min'])} "
        f"| {num(r['max'])} |"
        for r in rows
    ]
    floor = results.get("floor", {})
    if floor.get("cpu_hit_floor_s"):
        lines += [
            "",
            f"CPU-hit floor: GPU-hit TTFT {floor['gpu_hit_ttft_s'] * 1000:.1f} ms + "
            f"{floor['doc_kv_bytes'] / 2**30:.2f} GiB at {floor['h2d_gbps']} GB/s "
            f"({floor['transfer_s'] * 1000:.1f} ms) = {floor['cpu_hit_floor_s'] * 1000:.1f} ms",
        ]
    for arm, floor in results.get("decode_floor", {}).items():
        lines.append(
            f"Decode ceiling, {arm}: {floor['offloaded_bytes'] / 2**30:.2f} GiB of weights per "
            f"step at {results['options']['h2d_gbps']} GB/s = "
            f"{floor['step_transfer_s'] * 1000:.1f} ms, so at most "
            f"{floor['ceiling_tok_per_s']:.0f} tok/s at batch {results['options']['decode_batch']}"
        )
    return "\n".join(lines) + "\n"


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = {"reuse": _reuse_plot, "sweep": _sweep_plot, "decode": _decode_plot}
    return [
        plot(plt, results, out)
        for workload, plot in made.items()
        if any(a["runs"] and workload in a["runs"][0] for a in results["arms"].values())
    ]


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _reuse_plot(plt: Any, results: dict[str, Any], out: Path) -> Path:
    """TTFT by pass of the reuse workload, the CPU-hit floor dashed."""
    arms = results["arms"]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(arms))
    for i, (arm, data) in enumerate(arms.items()):
        for p in range(2):
            values = [
                v * 1000 for r in data["runs"] if (v := r["reuse"]["ttft_pass_s"][p]) is not None
            ]
            if not values:
                continue
            mid = statistics.median(values)
            ax.bar(
                p + i * width,
                mid,
                width,
                label=arm if p == 0 else None,
                color=f"C{i}",
                yerr=[[mid - min(values)], [max(values) - mid]],
            )
    floor = results.get("floor", {})
    if floor.get("cpu_hit_floor_s"):
        ax.axhline(floor["cpu_hit_floor_s"] * 1000, color="k", ls="--", label="CPU-hit floor")
    ax.set_xticks([x + width * (len(arms) - 1) / 2 for x in range(2)], ["pass 1", "pass 2"])
    ax.set_ylabel("TTFT per document (ms)")
    ax.set_title("Reuse beyond the GPU pool: TTFT by pass (bars: median, whiskers: spread)")
    ax.legend()
    return _save(plt, fig, out / "ttft_by_pass.png")


def _sweep_plot(plt: Any, results: dict[str, Any], out: Path) -> Path:
    """Throughput and TTFT p50 by request rate."""
    arms = results["arms"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (arm, data) in enumerate(arms.items()):
        sweep = data["runs"][0]["sweep"]
        labels = [rate_label(r["rate_rps"]).removesuffix("rps") for r in sweep]
        tput = [
            statistics.median(run["sweep"][k]["output_tok_per_s"] for run in data["runs"])
            for k in range(len(sweep))
        ]
        ttft = [
            statistics.median((run["sweep"][k]["ttft_p50_s"] or 0) * 1000 for run in data["runs"])
            for k in range(len(sweep))
        ]
        left.plot(labels, tput, marker="o", label=arm, color=f"C{i}")
        right.plot(labels, ttft, marker="o", label=arm, color=f"C{i}")
    left.set(xlabel="request rate (req/s)", ylabel="output tokens/s", title="Throughput")
    right.set(xlabel="request rate (req/s)", ylabel="TTFT p50 (ms)", title="Latency")
    left.legend()
    return _save(plt, fig, out / "sweep.png")


def _decode_plot(plt: Any, results: dict[str, Any], out: Path) -> Path:
    """Decode speed by arm against its host->GPU ceiling."""
    arms = results["arms"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (arm, data) in enumerate(arms.items()):
        values = [r["decode"]["decode_tok_per_s"] for r in data["runs"]]
        mid = statistics.median(values)
        ax.bar(i, mid, 0.6, color=f"C{i}", yerr=[[mid - min(values)], [max(values) - mid]])
        ceiling = results.get("decode_floor", {}).get(arm, {}).get("ceiling_tok_per_s")
        if ceiling:
            ax.plot([i - 0.3, i + 0.3], [ceiling] * 2, "k--")
    ax.set_xticks(range(len(arms)), list(arms))
    ax.set_ylabel("decode tokens/s (batch)")
    ax.set_title("Decode speed; dashed: the host->GPU ceiling of the offloaded weights")
    ax.set_yscale("log")
    return _save(plt, fig, out / "decode.png")


def write(results: dict[str, Any], out: Path) -> list[Path]:
    rows = summarize(results)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    with (out / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["arm", "metric", "unit", "median", "min", "max"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.md").write_text(markdown(results, rows))
    return [out / "results.json", out / "summary.csv", out / "summary.md", *plots(results, out)]
