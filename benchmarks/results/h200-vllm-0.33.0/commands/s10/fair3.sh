#!/bin/bash
# Fairness at a36bea6's rule (a spilled step beside others spaces the next, a long
# request's first chunk too), share 0.1, every scenario and chats beside the long
# request's prefill ('during'), with vLLM's --long-prefill-token-threshold 2048 as a
# second arm, and the all-GPU arm (a 10 GiB pool that holds the long request): LIMIT=s
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts, s10/setup.sh first"; exit 3; }
bash benchmarks/results/h200-vllm-0.33.0/commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh
work=/root/work/fair3; mkdir -p $work $OUT/fair3
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 --caps 2048 \
  --all-gpu-pool-gib 10 --scenarios before,during,with,wave16,wave32,waves,steady \
  --long-out 48 --deadline-s $((LIMIT - 90)) > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/fair3/ 2>/dev/null
(cd $work && tar -cJf $OUT/fair3/logs-fair3.tar.xz *.log 2>/dev/null)
tail -c 4000 $work/out.txt
