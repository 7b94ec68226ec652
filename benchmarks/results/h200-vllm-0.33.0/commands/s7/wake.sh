#!/bin/bash
# the wake micro-benchmark (serial vs pipelined arena wake), then the two-model switch
set -u; source .gpu/fork/sh/env.sh; export PYTHONSAFEPATH=1; mkdir -p $OUT/wake
timeout -k 10 ${WAKE_S:-150} python3 benchmarks/gpu/wake_bench.py \
  --config benchmarks/models/llama-3-8b/config.json --rounds ${ROUNDS:-10} --out $OUT/wake/wake.json 2>&1 | grep -v "^INFO" | tail -12
echo "wake_bench rc=${PIPESTATUS[0]}"
[ -n "${ARMS:-}" ] && ARM_S=${ARM_S:-330} bash .gpu/s6/switch.sh
grep -h "sleep arena: woke" $OUT/switch/*.log 2>/dev/null | cut -c1-200 | tail -8
