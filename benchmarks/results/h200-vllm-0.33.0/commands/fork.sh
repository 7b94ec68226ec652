#!/bin/bash
# Issue #42 part 2: benchmarks/gpu/fork_case.py (ARMS: default all three, one after another)
set -u; t0=$SECONDS; source .gpu/fork/sh/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout -k 15 ${LIMIT:-570} python3 benchmarks/gpu/fork_case.py --out $OUT/fork ${ARMS:+--arms $ARMS} 2>&1 | grep -v Warning | tail -90
grep -hE "Model loading took|Available KV cache|KV cache size|host extension|staged|scratch|Traceback|Error" $OUT/fork/*.log | cut -c1-250 | sort | uniq -c | sort -rn | head -25
echo "call done in $((SECONDS-t0)) s"
