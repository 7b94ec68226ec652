#!/bin/bash
# #41: whose is the decode ulp? 65,536 tokens: reference, staged, in-place (host blocks read in place, no staging); then staged again alone
set -u; t0=$SECONDS; source .gpu/fork/sh/env.sh
timeout -k 10 330 python3 benchmarks/gpu/staged_prefill.py --out $OUT/ulp --weights /root/ckpt --arms reference,staged,in-place --utilization reference=0.4,staged=0.25,in-place=0.25 2>&1 | grep -v Warning | grep -E "TTFT|control|same_|max_logprob|ratio|rror|failed"
timeout -k 10 $((570-SECONDS)) python3 benchmarks/gpu/staged_prefill.py --out $OUT/ulp2 --weights /root/ckpt --arms staged --utilization staged=0.3 2>&1 | grep -v Warning | grep -E "TTFT|rror|failed"
python3 - <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks/gpu")
from host_extension import compare
out = os.environ["OUT"]
a = json.load(open(f"{out}/ulp/staged_prefill.json"))["arms"]
b = json.load(open(f"{out}/ulp2/staged_prefill.json"))["arms"]
ref = a["reference"]["long"]
for name, long in (("staged", a.get("staged", {}).get("long")), ("in-place", a.get("in-place", {}).get("long")), ("staged-again", b.get("staged", {}).get("long"))):
    if long:
        print(name, "vs reference:", compare(long, ref))
if a.get("staged", {}).get("long") and b.get("staged", {}).get("long"):
    print("staged vs staged-again:", compare(b["staged"]["long"], a["staged"]["long"]))
PY
echo "ulp done in $((SECONDS-t0)) s"
