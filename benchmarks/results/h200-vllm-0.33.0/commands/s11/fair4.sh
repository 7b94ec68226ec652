#!/bin/bash
# Fairness at a36bea6's rule (a spilled step beside others spaces the next, a long
# request's first chunk too), share 0.1, the scenarios where the long request prefills
# beside chats first, with vLLM's --long-prefill-token-threshold 2048 as a second arm;
# no all-GPU arm (three servers at 0.3 fit an H100): LIMIT=s [NAME=fair4, its folders]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
name=${NAME:-fair4}; work=/root/work/$name; mkdir -p $work $OUT/$name
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 --caps 2048 \
  --scenarios ${SCENARIOS:-before,during,with,steady,wave32} \
  --long-out 48 --deadline-s $((LIMIT - 50)) > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
tail -c 5000 $work/out.txt
