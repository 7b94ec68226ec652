#!/bin/bash
# the vision encoder's profile at two image budgets (issue #46's planner): 'gpu' arm only
set -u; source .gpu/fork/sh/env.sh; export PYTHONSAFEPATH=1
for setting in "1m 1003520" "9.6m 9633792"; do
  set -- $setting; name=$1; px=$2; shift 2
  timeout -k 10 280 python3 benchmarks/gpu/vlm_parts.py --out $OUT/vlm-$name --arms gpu \
    --max-pixels $px --text-requests 2 --image-requests 2 "$@" 2>&1 | grep -v "^INFO\|^(" | tail -4
  grep -hE "peak activation|Available KV|Encoder cache will|Model loading took" $OUT/vlm-$name/*.log | cut -c1-300
  (cd $OUT/vlm-$name && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
  pkill -9 -f EngineCore; pkill -9 -f vllm_offload; sleep 2
done
