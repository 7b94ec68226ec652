#!/bin/bash
# Issue #58 on the GPU: the layered wake (residency.layered_wake) against the whole wake,
# two 8B models of the seeded random checkpoint, 8 GiB pools, max_resident 1, through
# `vllm-offload serve` (benchmarks/gpu/switch.py): SWITCHES switches each, every answer
# against each model's first (bit-identical is the test), one after the other on one
# machine (the whole arm compiles the cache the others reuse), then the control: the
# layered wake with its waits taken out (s16/no_waits.py), whose answers must move.
# LIMIT=s [SWITCHES=10]
set -u; bash benchmarks/results/h200-vllm-0.33.0/commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/layered; t0=$SECONDS
grep -q BENCH_LAYERED_NO_WAITS vllm_offload/vllm_ext/plugin.py \
  || cat benchmarks/results/h200-vllm-0.33.0/commands/s16/no_waits.py >> vllm_offload/vllm_ext/plugin.py
arm() {  # name seconds switch.py-flags...
  local name=$1 limit=$2; shift 2; local t=$SECONDS
  timeout -k 10 $limit python3 benchmarks/gpu/switch.py --checkpoint /root/ckpt-llama-3.1-8b \
    --out $OUT/layered/$name.json --models 2 --switches ${SWITCHES:-10} "$@" 2>&1 \
    | grep -v "^INFO\|^(\|^WARNING\|^DEBUG" | tail -14
  echo "$name: rc=${PIPESTATUS[0]} in $((SECONDS-t)) s"
  pkill -9 -f vllm_offload; pkill -9 -f EngineCore; sleep 3
}
arm whole $((LIMIT * 4 / 10)) --cache /root/cc/layered
export VLLM_CACHE_ROOT=/root/cc/layered/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/layered/inductor TRITON_CACHE_DIR=/root/cc/layered/triton
arm layered $((LIMIT * 3 / 10)) --layered-wake
left=$((LIMIT - (SECONDS - t0) - 10))
if [ $left -gt 100 ]; then BENCH_LAYERED_NO_WAITS=1 arm control $left --layered-wake; fi
grep -h "layered\|woke" $OUT/layered/*.log 2>/dev/null | grep -v "^INFO" | cut -c1-300 | head -12
(cd $OUT/layered && tar -cJf layered-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "layered.sh done in $((SECONDS-t0)) s"
