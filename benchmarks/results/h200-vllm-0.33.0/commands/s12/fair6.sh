#!/bin/bash
# The same with the cap arm (--long-prefill-token-threshold 2048), before and during: a
# third start of share 0.1 and a second of the cap, as run at 7a54af8.
set -u; cd /root/repo && source /root/vo/env.sh
w=/root/work/fair6 && mkdir -p $w $OUT/fair6
timeout 300 python3 benchmarks/gpu/fairness.py --out $w --shares 0.1 --caps 2048 --scenarios before,during \
  --long-out 48 --deadline-s 280 > $w/out.txt 2>&1; echo "rc $?"
cp $w/fairness.json $w/out.txt $OUT/fair6/; (cd $w && tar -cJf $OUT/fair6/logs-fair6.tar.xz *.log)
tail -c 1500 $w/out.txt
