"""Bench results as PNG plots (matplotlib, imported only when plotting)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from vllm_offload.bench.summary import rate_label


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
