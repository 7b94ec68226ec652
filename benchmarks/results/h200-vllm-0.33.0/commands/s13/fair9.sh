#!/bin/bash
# Issue #54 at d39a327 + the time-bounded chunk (a long request's prefill chunk beside
# others sized to ~0.25 s from its last one's rate): share 0.1, no cap arm, the scenarios
# where the long request prefills beside chats first. LIMIT=s [NAME=fair9]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
cd /root/repo && source /root/vo/env.sh
name=${NAME:-fair9}; work=/root/work/$name; mkdir -p $work $OUT/$name
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 \
  --scenarios ${SCENARIOS:-before,during,with,steady} \
  --long-out 48 --deadline-s $((LIMIT - 60)) > $work/out.txt 2>&1; echo "rc $?"
cp $work/fairness.json $work/out.txt $OUT/$name/ 2>/dev/null
(cd $work && tar -cJf $OUT/$name/logs-$name.tar.xz *.log 2>/dev/null)
grep -E "^(before|during|with|steady) " $work/out.txt | sed -E "s/\{'alone_tails.*measured_share'/ share/"
