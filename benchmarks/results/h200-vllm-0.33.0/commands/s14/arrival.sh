#!/bin/bash
# Issue #54, fair10's misses at the long request's arrival (50-64 ms gaps before it is
# scheduled): vLLM's own all-GPU pool beside the same chats (whether a server without a
# host extension pays the same), each step logged as in fair10.sh; with SWITCH=s the
# share server's engine runs at that switch interval (appended on the host only to
# fair_scheduler.py, which only that engine imports). Three servers at 0.3 of an H100:
# 15 GiB of weights each, the all-GPU pool 9 GiB (60,000 + 16 x 384 tokens: 8.1 GiB).
# LIMIT=s [NAME=arrival] [SCENARIOS=before,with] [SWITCH=] [ARGS]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
commands=benchmarks/results/h200-vllm-0.33.0/commands
target=vllm_offload/vllm_ext/fair_scheduler.py
grep -q STEPLOG $target || cat $commands/s13/step_log.py $commands/s14/step_log_arrivals.py >> $target
if [ -n "${SWITCH:-}" ] && ! grep -q setswitchinterval $target; then
  printf 'import sys as _sys\n\n_sys.setswitchinterval(%s)\n' "$SWITCH" >> $target
fi
python3 -c 'import vllm_offload.vllm_ext.fair_scheduler' || exit 4
name=${NAME:-arrival}; work=/root/work/$name; mkdir -p $work $OUT/$name
# shellcheck disable=SC2086
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 \
  --scenarios ${SCENARIOS:-before,with} --long-out 48 --all-gpu-pool-gib 9 \
  --deadline-s $((LIMIT - 60)) ${ARGS:-} > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
grep -E "^(before|with|during|steady|wave32) " $work/out.txt | sed -E "s/\{'alone_tails.*measured_share'/ share/" | cut -c1-400
