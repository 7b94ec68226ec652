#!/bin/bash
# Fairness at the share 0.1 with a spilled step alone holding none back, beside an
# all-GPU arm whose pool holds the long request (issue #54): LIMIT=s
set -u; cd /root/repo && source /root/vo/env.sh
work=/root/work/fair2; mkdir -p $work $OUT/fair2
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 --all-gpu-pool-gib 10 \
  --scenarios steady,before --long-out 48 --deadline-s $((LIMIT - 60)) > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/fair2/ 2>/dev/null
(cd $work && tar -cJf $OUT/fair2/logs-fair2.tar.xz *.log 2>/dev/null)
tail -c 3000 $work/out.txt
