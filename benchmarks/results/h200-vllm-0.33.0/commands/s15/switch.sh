#!/bin/bash
# Issue #54, fair10's misses at the long request's arrival (50-64 ms gaps before it is
# scheduled), in one run: the share server at Python's default switch interval (5 ms)
# and at SWITCH (0.5 ms by default; s15/switch_interval.py, appended on the host only),
# and vLLM's own all-GPU pool beside the same chats (does a server without a host
# extension pay the same?). Each step logged as in fair10. Three servers at 0.3 of an
# H100: 15 GiB of weights each, the all-GPU pool 9 GiB (60,000 + 16 x 384 tokens).
# LIMIT=s [NAME=switch] [SCENARIOS=before,with] [SWITCH=0.0005] [ARGS]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
commands=benchmarks/results/h200-vllm-0.33.0/commands
target=vllm_offload/vllm_ext/fair_scheduler.py
grep -q STEPLOG $target || cat $commands/s13/step_log.py $commands/s14/step_log_arrivals.py >> $target
plugin=vllm_offload/vllm_ext/plugin.py
grep -q BENCH_SWITCH_INTERVAL_S $plugin || cat $commands/s15/switch_interval.py >> $plugin
BENCH_SWITCH_INTERVAL_S=0.0005 python3 -c 'import sys, vllm_offload.vllm_ext.plugin, vllm_offload.vllm_ext.fair_scheduler; assert sys.getswitchinterval() < 0.001' || exit 4
name=${NAME:-switch}; work=/root/work/$name; mkdir -p $work $OUT/$name
switch=${SWITCH:-0.0005}
# shellcheck disable=SC2086
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 \
  --scenarios ${SCENARIOS:-before,with} --long-out 48 --all-gpu-pool-gib 9 \
  --switch-intervals $switch --arms share-0.1,share-0.1-switch$switch,all-gpu \
  --deadline-s $((LIMIT - 60)) ${ARGS:-} > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
grep -E "^(before|with|during|steady|wave32) " $work/out.txt | sed -E "s/\{'alone_tails.*measured_share'/ share/" | cut -c1-400
