#!/bin/bash
# Issue #54, fair7's 'before' and 'with': two long steps back to back, the first one not in
# the share's count. The same fairness run with each step logged (s13/step_log.py appended
# to the host's copy of fair_scheduler.py: the repository's is unchanged). LIMIT=s
# [NAME=steplog] [SCENARIOS=before,with] [CAPS=2048: none with CAPS=] [ARGS: more for
# fairness.py, e.g. ARGS='--all-gpu-pool-gib 14' for vLLM's own pool beside them]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
here=benchmarks/results/h200-vllm-0.33.0/commands/s13
grep -q STEPLOG vllm_offload/vllm_ext/fair_scheduler.py || cat $here/step_log.py >> vllm_offload/vllm_ext/fair_scheduler.py
python3 -c 'import vllm_offload.vllm_ext.fair_scheduler' || exit 4
name=${NAME:-steplog}; work=/root/work/$name; mkdir -p $work $OUT/$name
# shellcheck disable=SC2086
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 --caps "${CAPS-2048}" \
  --scenarios ${SCENARIOS:-before,with} --long-out 16 --deadline-s $((LIMIT - 40)) ${ARGS:-} \
  > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
grep -E "^(before|with|during) " $work/out.txt | cut -c1-300
