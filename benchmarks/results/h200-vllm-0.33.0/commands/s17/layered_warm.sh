#!/bin/bash
# Issue #58 when a call has ~300 s left after s15/deep.sh on the same machine: two servers
# with the layered wake (two 8B models, 4 switches each), each a fresh process tree on the
# compile caches deep.sh left in /root/cc/deep (no cold reference arm: it costs 240 s), their
# answers against deep.sh's keep.json (the level-1 arm's, carried back as .gpu/keep.json)
# by s17/same_across.py; each wake's copy timeline as s17/layered_starts.sh logs it.
set -u; commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/starts; t0=$SECONDS
cat $commands/s17/wake_timeline.py >> vllm_offload/vllm_ext/layered_wake.py
source $commands/switch_arm.sh
export VLLM_CACHE_ROOT=/root/cc/deep/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/deep/inductor TRITON_CACHE_DIR=/root/cc/deep/triton
for n in 1 2; do
  left=$((300 - (SECONDS - t0) - 15)); [ $left -gt 110 ] || { echo "start $n: skipped ($left s left)"; break; }
  switch_arm layered-$n $left $OUT/starts --models 2 --switches 4 --layered-wake
done
python3 $commands/s17/same_across.py --out $OUT/starts/same.json $OLDPWD/.gpu/keep.json $OUT/starts/layered-*.json 2>&1 | tail -3
grep -h "WAKETL [0-9]" $OUT/starts/*.log | sed -E 's/.*WAKETL/WAKETL/' | head -12
(cd $OUT/starts && tar -cJf starts-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
