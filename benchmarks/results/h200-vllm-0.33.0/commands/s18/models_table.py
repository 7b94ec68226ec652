"""docs/several-models.md's table for 1, 2 and 3 models, printed from the raw files of
benchmarks/gpu/switch.py (one run a row): start-up until every model was ready, each
engine's host RAM (its process tree's RSS) against the planned figure the front door
showed for its state, its GPU memory while asleep, and the first token after each switch.
  python3 models_table.py one.json two.json three.json"""

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks" / "gpu"))
from kit.stream import nearest_rank

GIB = 1 << 30


def alone_planned(plan: str) -> float:
    """One engine's host RAM as `plan` prints it for a model served alone: vLLM itself
    (the "host RAM" line) and its CPU tier (the "size" line under it)."""
    itself = re.search(r"vLLM itself ~([0-9.]+) GiB", plan)
    tier = re.search(r"^  size +([0-9.]+) GiB", plan, re.M)
    assert itself and tier, "the plan's host RAM and tier lines"
    return (float(itself[1]) + float(tier[1])) * GIB


def row(path: str) -> str:
    with open(path) as raw:
        result = json.load(raw)
    models = result["config"].count("[[models]]")
    card = "H100" if "/h100-" in path else "H200"  # the folder of the raw file says
    cells = [str(models), card, f"{result['start_s']:.1f} s"]
    if "rss" not in result:  # the run ended after its start (one.json: no engine to read)
        return "| " + " | ".join([*cells, *["not measured"] * 4]) + f" | `{path}` |"
    last = result["rss"][-1]
    serving, asleep, planned = [], [], []
    for engine in last.values():
        if not isinstance(engine, dict):  # "when", the device's used memory
            continue
        door = engine.get("front_door")
        if door is None:  # one model: vLLM alone, planned as "vLLM itself" and its tier
            serving.append(engine)
            planned.append((engine["rss_bytes"], alone_planned(result["plan"])))
            continue
        state = "serving" if door["status"] == "serving" else "away"
        (serving if state == "serving" else asleep).append(engine)
        planned.append((engine["rss_bytes"], door["planned"][f"host_bytes_{state}"]))
    worst = max(planned, key=lambda p: abs(p[1] - p[0]) / p[0])
    cells.append(
        f"{worst[0] / GIB:.2f} GiB measured, {worst[1] / GIB:.2f} planned "
        f"({(worst[1] - worst[0]) / worst[0]:+.1%}, the farthest of {len(planned)})"
    )
    gpu_asleep = [e["gpu_bytes"] / GIB for e in asleep]
    cells.append(f"{min(gpu_asleep):.2f}-{max(gpu_asleep):.2f} GiB" if gpu_asleep else "-")
    firsts = [s["first_token_s"] for s in result.get("switches", [])]
    if not firsts:  # one model: nothing to switch to
        return "| " + " | ".join([*cells, "-", "-"]) + f" | `{path}` |"
    cells.append(
        f"{statistics.median(firsts):.3f} / {nearest_rank(firsts, 0.95):.3f} s "
        f"({min(firsts):.3f}-{max(firsts):.3f}, {len(firsts)} switches)"
    )
    same = sum(s["same"]["same_tokens"] and s["same"]["same_logprobs"] for s in result["switches"])
    cells.append(f"{same} of {len(firsts)}")
    return "| " + " | ".join(cells) + f" | `{path}` |"


print(
    "| models | card | all ready | host RAM per engine | GPU memory asleep | first token after a "
    "switch: p50 / p95 | answers the same | raw |"
)
print("|---|---|---|---|---|---|---|---|")
for path in sys.argv[1:]:
    print(row(path))
