"""Bench results written: JSON (everything), CSV and Markdown (the summary) and PNG plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from vllm_offload.bench.plots import plots
from vllm_offload.bench.summary import summarize


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


def write(results: dict[str, Any], out: Path) -> list[Path]:
    rows = summarize(results)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    with (out / "summary.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["arm", "metric", "unit", "median", "min", "max"])
        writer.writeheader()
        writer.writerows(rows)
    (out / "summary.md").write_text(markdown(results, rows))
    return [out / "results.json", out / "summary.csv", out / "summary.md", *plots(results, out)]
