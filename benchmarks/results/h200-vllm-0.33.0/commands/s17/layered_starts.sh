#!/bin/bash
# Issue #58: the layered wake's answers over fresh starts. Two 8B models of the seeded
# random checkpoint, 8 GiB pools, max_resident 1, through `vllm-offload serve`
# (benchmarks/gpu/switch.py): first the whole wake with its compile caches emptied (the
# reference), then STARTS servers with the layered wake, each a fresh process tree on the
# caches the first compiled, SWITCHES switches each; every answer against the reference's
# first (s17/same_across.py); the layered starts log each wake's copy timeline
# (s17/wake_timeline.py, appended on the host). LIMIT=s [STARTS=3] [SWITCHES=6]
set -u; commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/starts; t0=$SECONDS
grep -q WAKETL vllm_offload/vllm_ext/layered_wake.py \
  || cat $commands/s17/wake_timeline.py >> vllm_offload/vllm_ext/layered_wake.py
source $commands/switch_arm.sh
arm() { switch_arm "$1" "$2" $OUT/starts --models 2 --switches ${SWITCHES:-6} "${@:3}"; }
arm whole 240 --cache /root/cc/starts
export VLLM_CACHE_ROOT=/root/cc/starts/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/starts/inductor TRITON_CACHE_DIR=/root/cc/starts/triton
for n in $(seq 1 ${STARTS:-3}); do
  left=$((LIMIT - (SECONDS - t0) - 15))
  [ $left -gt 110 ] || { echo "start $n: skipped ($left s left)"; break; }
  arm layered-$n $left --layered-wake
done
python3 $commands/s17/same_across.py --out $OUT/starts/same.json $OUT/starts/whole.json $OUT/starts/layered-*.json
grep -h "WAKETL [0-9]" $OUT/starts/*.log | sed -E 's/.*WAKETL/WAKETL/' | head -12
(cd $OUT/starts && tar -cJf starts-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "layered_starts.sh done in $((SECONDS-t0)) s"
