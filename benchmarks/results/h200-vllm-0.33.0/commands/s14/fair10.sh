#!/bin/bash
# Issue #54 at the fourteenth session's tree: a long request's prefill chunk beside others
# launched once the step in flight is handed over (one empty step first), with 346bda0's
# review fixes; each step logged (s13/step_log.py and s14/step_log_arrivals.py appended to
# the host's copy of fair_scheduler.py only), the chats' and the long request's start in
# vLLM's clock. LIMIT=s [NAME=fair10] [SCENARIOS=before,with,during,steady,wave32] [ARGS]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
commands=benchmarks/results/h200-vllm-0.33.0/commands
target=vllm_offload/vllm_ext/fair_scheduler.py
grep -q STEPLOG $target || cat $commands/s13/step_log.py $commands/s14/step_log_arrivals.py >> $target
python3 -c 'import vllm_offload.vllm_ext.fair_scheduler' || exit 4
name=${NAME:-fair10}; work=/root/work/$name; mkdir -p $work $OUT/$name
# shellcheck disable=SC2086
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 \
  --scenarios ${SCENARIOS:-before,with,during,steady,wave32} --long-out 48 \
  --deadline-s $((LIMIT - 60)) ${ARGS:-} > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
grep -E "^(before|with|during|steady|wave32) " $work/out.txt | sed -E "s/\{'alone_tails.*measured_share'/ share/" | cut -c1-400
