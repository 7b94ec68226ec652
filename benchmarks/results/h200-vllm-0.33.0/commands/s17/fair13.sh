#!/bin/bash
# Issue #54 at the seventeenth session's tree: the share's wait runs only while a spilled
# request and others are together, and a long request waiting for its first chunk waits
# it out too; against the rules before (share-0.1-base: vllm_offload at 916780a, carried
# in .gpu/base as `git archive 916780a vllm_offload` unpacks it) in the same run; each
# chat's reference is its runs alone on the same server. This call's tree replaces
# /root/repo's first.
# LIMIT=s [NAME=fair13] [SCENARIOS=waves,steady] [REPEATS=3] [ARGS]
set -u
[ -f /root/vo/env.sh ] || { echo "FRESH MACHINE: stage the parts first"; exit 3; }
commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
base=/root/base; rm -rf $base && mkdir -p $base && cp -a .gpu/base/vllm_offload $base/ || exit 5
grep -q "_apart_since" $base/vllm_offload/vllm_ext/spill_share.py && { echo "BASE IS THE HEAD"; exit 6; }
NAME=${NAME:-fair13} SCENARIOS=${SCENARIOS:-waves,steady} \
ARGS="--repeats ${REPEATS:-3} --arms share-0.1,share-0.1-base --base-tree $base ${ARGS:-}" \
  bash $commands/s14/fair10.sh
grep -E "^waves " /root/work/${NAME:-fair13}/out.txt | sed -E "s/\{'alone_tails.*measured_share'/ share/" | cut -c1-400
