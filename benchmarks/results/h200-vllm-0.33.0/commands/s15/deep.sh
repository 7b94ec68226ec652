#!/bin/bash
# Issue #58 on the GPU: deep sleep (residency.deep_sleep: each model put to sleep is
# checkpointed off the GPU by the driver, restored before its wake) against the level-1
# sleep it builds on. Three 8B models of the seeded random checkpoint, 8 GiB pools, 4 GiB
# CPU tiers, max_resident 1, through `vllm-offload serve` (benchmarks/gpu/switch.py): six
# switches each, answers against each model's first, memory per engine beside `ps`.
#   deep   --deep-sleep, compile caches emptied first (a cold start: b and c start side by
#          side in ~140 s, then a in ~70 s; the fifteenth session's 205 s ended there)
#   keep   the default, on the caches deep left (warm)
# LIMIT=s for both (560: deep gets 340 s)
set -u; bash benchmarks/results/h200-vllm-0.33.0/commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/deep; t0=$SECONDS
source benchmarks/results/h200-vllm-0.33.0/commands/switch_arm.sh
arm() { switch_arm "$1" "$2" $OUT/deep --models 3 --switches 6 "${@:3}"; }
arm deep $((LIMIT * 6 / 10)) --deep-sleep --cache /root/cc/deep
export VLLM_CACHE_ROOT=/root/cc/deep/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/deep/inductor TRITON_CACHE_DIR=/root/cc/deep/triton
left=$((LIMIT - (SECONDS - t0)))
if [ $left -gt 120 ]; then arm keep $left; else echo "keep: skipped ($left s left)"; fi
grep -h "checkpoint\|restored\|slept" $OUT/deep/*.log 2>/dev/null | grep -v "^INFO" | head -20
(cd $OUT/deep && tar -cJf deep-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "deep.sh done in $((SECONDS-t0)) s"
