#!/bin/bash
# Fairness at a36bea6's rule again, share 0.1 alone, the three scenarios where the long
# request prefills beside chats (a second fresh start beside fair4's), as run at 7a54af8.
set -u; cd /root/repo && source /root/vo/env.sh
w=/root/work/fair5 && mkdir -p $w $OUT/fair5
timeout 490 python3 benchmarks/gpu/fairness.py --out $w --shares 0.1 --scenarios before,during,with \
  --long-out 48 --deadline-s 440 > $w/out.txt 2>&1; echo "rc $?"
cp $w/fairness.json $w/out.txt $OUT/fair5/; (cd $w && tar -cJf $OUT/fair5/logs-fair5.tar.xz *.log)
tail -c 3000 $w/out.txt
