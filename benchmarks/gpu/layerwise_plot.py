#!/usr/bin/env python3
"""Issue #19's figure from one `release.sh 0.32.0 hits` run (`vllm-offload bench` results):
left, TTFT per pass per arm (median of the repeats' medians, whiskers min-max) with the
CPU-hit floor; right, pass 2 split into the server's own stages (vLLM's queue time, then
its prefill time, which for a CPU hit includes waiting for the layer-wise copy) and what
the client saw beyond the server's TTFT. Prints the table it draws.

    benchmarks/gpu/layerwise_plot.py RESULTS.json OUT.png
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

STAGES = {  # server_per_doc key -> label
    "vllm:request_queue_time_seconds_sum": "queued (server)",
    "vllm:request_prefill_time_seconds_sum": "prefill (server)",
}


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def pass2_stages(arm: dict[str, Any]) -> dict[str, float]:
    """Each server stage in pass 2 (the bench records it per document, averaged over the
    pass; median of the repeats), and the client's remainder over the median TTFT."""
    per_doc = [doc for run in arm["runs"] for doc in run["reuse"]["server_per_doc"][1:]]
    ttfts = [r["ttft_s"] for run in arm["runs"] for r in run["reuse"]["passes"][1]]
    stages = {
        label: statistics.median(d.get(key, 0.0) for d in per_doc) * 1000
        for key, label in STAGES.items()
    }
    server_ttft = statistics.median(d["vllm:time_to_first_token_seconds_sum"] for d in per_doc)
    stages["client, HTTP, detokenize"] = (statistics.median(ttfts) - server_ttft) * 1000
    return stages


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    arms = results["arms"]
    floor_ms = results["floor"]["cpu_hit_floor_s"] * 1000
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(arms)
    print(f"CPU-hit floor {floor_ms:.1f} ms")
    for i, (name, arm) in enumerate(arms.items()):
        for p in range(2):
            mid, low, high = spread([r["reuse"]["ttft_pass_s"][p] * 1000 for r in arm["runs"]])
            left.bar(
                p + i * width,
                mid,
                width,
                color=f"C{i}",
                label=name if p == 0 else None,
                yerr=[[mid - low], [high - mid]],
            )
            print(f"{name} pass {p + 1}: {mid:.1f} ms ({low:.1f}-{high:.1f})")
    left.axhline(floor_ms, color="k", ls="--", label=f"CPU-hit floor {floor_ms:.1f} ms")
    left.set_xticks([x + width * (len(arms) - 1) / 2 for x in range(2)], ["pass 1", "pass 2"])
    left.set(ylabel="TTFT per document (ms)", title="TTFT by pass (median, min-max)")
    left.legend(fontsize=8)
    bottom = [0.0] * len(arms)
    names = list(arms)
    for j, label in enumerate([*STAGES.values(), "client, HTTP, detokenize"]):
        values = [pass2_stages(arms[n])[label] for n in names]
        right.bar(names, values, bottom=bottom, label=label, color=f"C{j + 5}")
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        print(label, {n: round(v, 2) for n, v in zip(names, values, strict=True)})
    right.axhline(floor_ms, color="k", ls="--")
    right.set(ylabel="ms per document (median of repeats)", title="Pass 2: where the time goes")
    right.legend(fontsize=8)
    fig.suptitle("8,000-token documents, Llama-3-8B shape, H200, vLLM 0.32.0")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
