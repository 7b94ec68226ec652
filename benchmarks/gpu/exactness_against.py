#!/usr/bin/env python3
"""Issue #54, no GPU needed: one exactness call's answers against another call's
reference (its all-GPU answers), as if that call had run with ``--against``. A reference
holds for one kind of GPU: an H100's all-GPU answers part from an H200's at the first
tokens (same checkpoint and prompts, kernels pinned; h100-vllm-0.33.0/exactness/), so a
call on an H100 is compared with an H100's reference from another call.

    benchmarks/gpu/exactness_against.py ANSWERS.json REFERENCE.json --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from exactness import differences, summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("answers", type=Path, help="an exactness.json whose rounds are compared")
    parser.add_argument("reference", type=Path, help="an exactness.json holding a reference")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    record = json.loads(args.answers.read_text())
    earlier = json.loads(args.reference.read_text())
    record["reference_from"] = f"{earlier['reference_from']} ({args.reference})"
    for done in record["rounds"]:
        done["differences"] = differences(done["answers"], earlier["reference"])
    record["summary"] = summary(record)
    args.out.write_text(json.dumps(record["summary"], indent=1) + "\n")
    print(json.dumps(record["summary"], indent=1))


if __name__ == "__main__":
    main()
