#!/bin/bash
# Fairness at shares 0.1 and 0.15 (issue #54): LIMIT=s
set -u; cd /root/repo && source /root/vo/env.sh
work=/root/work/fair; mkdir -p $work $OUT/fair
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1,0.15 --long-out 48 \
  --deadline-s $((LIMIT - 120)) > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/fair/ 2>/dev/null
(cd $work && tar -cJf $OUT/fair/logs-fair.tar.xz *.log 2>/dev/null)
tail -c 4000 $work/out.txt
