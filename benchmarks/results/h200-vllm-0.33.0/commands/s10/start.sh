#!/bin/bash
# Issue #58 on the GPU: several models ready in the time of one. Three 8B models (the seeded
# random checkpoint), 8 GiB pools, 4 GiB CPU tiers, max_resident 1, through
# `vllm-offload serve` (benchmarks/gpu/switch.py), one arm after another:
#   one        one model, its compile caches emptied first: one engine's start
#   three      three models, caches emptied: ready for all (the plan's start batches),
#              six switches (a -> b -> c -> a ...), memory measured beside `ps`'s figures
#   release    three models, residency.host_copy = release, the caches three left (warm):
#              put-away and switch times without the kept copy
set -u; bash benchmarks/results/h200-vllm-0.33.0/commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/start; t0=$SECONDS
arm() {  # name seconds switch.py-flags...
  local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout -k 10 $limit python3 benchmarks/gpu/switch.py --checkpoint /root/ckpt-llama-3.1-8b \
    --out $OUT/start/$name.json "$@" 2>&1 | grep -v "^INFO\|^(\|^WARNING\|^DEBUG" | tail -25
  echo "$name: rc=${PIPESTATUS[0]} in $((SECONDS-t)) s"
  pkill -9 -f vllm_offload; pkill -9 -f EngineCore; sleep 3
}
arm one 210 --models 1 --switches 0 --cache /root/cc/one
arm three 280 --models 3 --switches 6 --cache /root/cc/three
left=$((575 - (SECONDS - t0)))
if [ $left -gt 150 ]; then
  export VLLM_CACHE_ROOT=/root/cc/three/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/three/inductor TRITON_CACHE_DIR=/root/cc/three/triton
  arm release $left --models 3 --switches 6 --host-copy release
else echo "release: skipped ($left s left)"; fi
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
(cd $OUT/start && tar -cJf start-logs.tar.xz ./*.log && rm -f ./*.log)
echo "start.sh done in $((SECONDS-t0)) s"
