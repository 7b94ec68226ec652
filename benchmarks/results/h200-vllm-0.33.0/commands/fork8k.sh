#!/bin/bash
# #41/#42: the fork's bf16-ext arm with 8,192-token prefill chunks (vLLM's default on a 24 GiB card is 2,048):
# TTFT at the larger chunk, and the pool vLLM measures with its larger activation peak
set -u; t0=$SECONDS; source .gpu/fork/sh/env.sh
timeout -k 15 ${LIMIT:-400} python3 benchmarks/gpu/fork_case.py --out $OUT/fork8k --arms bf16-ext --chunk-tokens 8192 2>&1 | grep -v Warning | tail -60
grep -hE "Model loading took|Available KV cache|KV cache size|host extension|Traceback|Error" $OUT/fork8k/*.log | cut -c1-250 | sort | uniq -c | sort -rn | head -15
echo "call done in $((SECONDS-t0)) s"
