#!/bin/bash
# Issue #58: what a live process keeps on the GPU that no sleep hands back (torch alone),
# then the 2-model row of s10/start.sh (two 8B models, caches emptied, four switches).
set -u; bash benchmarks/results/h200-vllm-0.33.0/commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/floor $OUT/start; t0=$SECONDS
timeout 150 python3 benchmarks/gpu/gpu_floor.py --out $OUT/floor 2>&1 | tail -30
echo "floor: rc=${PIPESTATUS[0]} in $((SECONDS-t0)) s"; t=$SECONDS
timeout -k 10 ${LIMIT:-400} python3 benchmarks/gpu/switch.py --checkpoint /root/ckpt-llama-3.1-8b \
  --out $OUT/start/two.json --models 2 --switches 4 --cache /root/cc/two 2>&1 \
  | grep -v "^INFO\|^(\|^WARNING\|^DEBUG" | tail -25
echo "two: rc=${PIPESTATUS[0]} in $((SECONDS-t)) s"
pkill -9 -f vllm_offload; pkill -9 -f EngineCore
(cd $OUT/start && tar -cJf two-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "two.sh done in $((SECONDS-t0)) s"
