#!/bin/bash
# Issue #58's table for 1, 2 and 3 models from one card (docs/several-models.md): three 8B
# models of the seeded random checkpoint at most (s9/ckpt.sh first), 8 GiB pools, 4 GiB
# CPU tiers, max_resident 1, level-1 sleep keeping the host copy, each arm's compile
# caches emptied first (a cold start, as one.json/two.json/three.json were):
#   one    one model: its start and its process tree's RSS against plan's lines
#   two    two models, four switches; three: three models, six switches
# Each writes under $OUT/models as it ends; the table: s18/models_table.py one.json ...
# LIMIT=s (~500 s: ~135 + ~145 + ~185)
set -u; commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh && source $commands/switch_arm.sh
dir=$OUT/models; mkdir -p $dir; t0=$SECONDS
switch_arm one 200 $dir --models 1 --switches 0 --cache /root/cc/one
switch_arm two 220 $dir --models 2 --switches 4 --cache /root/cc/two
left=$((LIMIT - (SECONDS - t0)))
if [ $left -gt 170 ]; then switch_arm three $left $dir --models 3 --switches 6 --cache /root/cc/three
else echo "three: skipped ($left s left)"; fi
rows=(); for n in one two three; do [ -f $dir/$n.json ] && rows+=($dir/$n.json); done
python3 $commands/s18/models_table.py "${rows[@]}"  # in that order (ls sorted three before two)
(cd $dir && tar -cJf models-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "models123.sh done in $((SECONDS - t0)) s"
