#!/bin/bash
# Issue #54 at the seventeenth session's tree: the share's wait runs only while a spilled
# request and others are together, where long requests first meet others the first step
# waits as after a long one, and a long request waiting for its first chunk waits too;
# against the rules before (share-0.1-base: vllm_offload at 916780a, carried in .gpu/base
# as `git archive 916780a vllm_offload` unpacks it) in the same run; each chat's
# reference is its runs alone on the same server. Everything is written under $OUT as it
# goes (fairness.json after each scenario, the servers' logs), so that a run cut short by
# the call's limit still brings back what it measured (the seventeenth session's first
# try, written to /root/work and copied at its end, came back with nothing). LIMIT must
# be below the call's limit_s, which is the device time left where that is less. The
# base is any earlier tree in .gpu/base (fair13: 916780a; fair14: cb336f2); fairness.py
# refuses to run unless the base arm imports it (in fair13 it did not: kit.arms.tree_env).
# LIMIT=s [NAME=fair13] [SCENARIOS=before,with,waves] [REPEATS=3] [ARGS]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
base=/root/base; rm -rf $base && mkdir -p $base && cp -a .gpu/base/vllm_offload $base/ || exit 5
diff -rq -x __pycache__ $base/vllm_offload vllm_offload > /dev/null && { echo "BASE IS THE HEAD"; exit 6; }
cd /root/repo && source /root/vo/env.sh
name=${NAME:-fair13}; work=$OUT/$name; mkdir -p $work
# shellcheck disable=SC2086
timeout $LIMIT python3 benchmarks/gpu/fairness.py --out $work --shares 0.1 \
  --scenarios ${SCENARIOS:-before,with,waves} --long-out 48 --deadline-s $((LIMIT - 60)) \
  --repeats ${REPEATS:-3} --arms share-0.1,share-0.1-base --base-tree $base ${ARGS:-} \
  > $work/out.txt 2>&1; echo "rc $?"
(cd $work && tar -cJf logs-$name.tar.xz ./*.log && rm -f ./*.log)
grep -E "^(before|with|waves[0-9]*|steady|wave32) " $work/out.txt \
  | sed -E "s/\{'alone_tails.*measured_share'/ share/" | cut -c1-400
