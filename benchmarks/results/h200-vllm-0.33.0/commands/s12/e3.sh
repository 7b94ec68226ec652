#!/bin/bash
# Issue #54: the exactness gate's last five staged cold starts against E1's reference (an
# H200's all-GPU answer): on an H200 side by side at staged=0.15, on an H100 (80 GB) in two
# rounds at staged=0.27 (21.6 GB each, as 0.15 of an H200). LIMIT=s
set -u
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$total" -lt 100000 ]; then
  export ROUNDS='staged-repro*3;staged-repro-share1,staged-repro-pool4' UTIL=gpu=0.45,staged=0.27,inplace=0.27
else
  export ROUNDS='staged-repro*3,staged-repro-share1,staged-repro-pool4'
fi
echo "GPU memory $total MiB: rounds $ROUNDS"
CALL=E3 AGAINST=/root/repo/benchmarks/results/h200-vllm-0.33.0/exactness/E1/exactness.json \
  bash benchmarks/results/h200-vllm-0.33.0/commands/s9/stress.sh
