#!/usr/bin/env python3
"""Issue #58: the answers of several benchmarks/gpu/switch.py runs (each a fresh server)
against one reference run's: each run's first answer of every model against the
reference's first answer of 'a' (one checkpoint for all models), and each switch's
answer against its run's first (switch.py's own check). Prints a line a run; writes
the comparison to the path after --out.
  same_across.py --out OUT.json REFERENCE.json RUN.json..."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks" / "gpu"))
from kit.stream import compare_records


def main() -> None:
    out, reference, *runs = sys.argv[2:] if sys.argv[1] == "--out" else sys.exit(__doc__)
    first = json.loads(Path(reference).read_text())["same"]["first"]["a"]
    report = {}
    for path in runs:
        run = json.loads(Path(path).read_text())
        firsts = {m: compare_records(a, first) for m, a in run["same"]["first"].items()}
        switches = [s["same"] for s in run.get("switches", []) if s.get("same")]
        same = all(c["same_tokens"] and c["same_logprobs"] for c in [*firsts.values(), *switches])
        report[path] = {"firsts": firsts, "switches": len(switches), "all_same": same}
        worst = max(c["max_logprob_diff"] or 0.0 for c in [*firsts.values(), *switches])
        print(
            f"{Path(path).name}: {len(firsts)} first answers, {len(switches)} switches, "
            f"all bit-identical to the reference: {same} (worst logprob diff {worst})"
        )
    Path(out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
