#!/bin/bash
# One exactness stress call (issue #54): CALL=E1 ROUNDS='...' LIMIT=s [AGAINST=json] [TIMING=1]
# [LENGTHS=a,b,c] [PER_ARM=n]
# Lengths 40,000 / 70,000 / 100,000 (in-place arms 40,000), 16 tokens, 5 logprobs; the
# all-GPU reference on a 13 GiB pool, staged arms 2 GiB (or 4) + 12 GiB of host RAM.
set -u; cd /root/repo && source /root/vo/env.sh
work=/root/work/$CALL; mkdir -p $work $OUT/$CALL
timeout $LIMIT python3 benchmarks/gpu/exactness.py --out $work --checkpoint /root/ckpt-llama-3.1-8b \
  --rounds "$ROUNDS" --lengths ${LENGTHS:-40000,70000,100000} --inplace-lengths 40000 --output-tokens 16 \
  --gpu-pool-gib 13 --extension-gib 12 --utilization ${UTIL:-gpu=0.25,staged=0.15,inplace=0.15} \
  --controls gpu-repro --lengths-per-arm ${PER_ARM:-2} --deadline-s $((LIMIT - 20)) ${AGAINST:+--against $AGAINST} ${TIMING:+--timing} \
  --call $CALL > $work/out.txt 2>&1; echo "rc $?"
cp $work/exactness.json /root/ex-$CALL.json 2>/dev/null
cp $work/exactness.json $work/out.txt $OUT/$CALL/ 2>/dev/null
(cd $work && tar -cJf $OUT/$CALL/logs-$CALL.tar.xz r*/ 2>/dev/null)
tail -c 5000 $work/out.txt
