#!/bin/bash
# Issue #58's switch below the copy by copying less: residency.asleep_weights_on_gpu_gib
# (a model asleep keeps its last layers and head on the GPU, a wake copies the rest). Two
# 8B models of the seeded random checkpoint, 8 GiB pools, max_resident 1, through
# `vllm-offload serve` (benchmarks/gpu/switch.py), SWITCHES switches each, one machine:
#   whole      the default wake, compile caches emptied first (the reference answers)
#   layered    the layered wake (warm caches)
#   gpuN       the layered wake, N GiB of each sleeping model's weights kept on the GPU
#   gpuN-whole the whole wake with them
# every answer against the reference's first (s17/same_across.py); each engine's GPU memory
# asleep in the JSON's rss. LIMIT=s [GIB=7] [SWITCHES=6]
set -u; commands=benchmarks/results/h200-vllm-0.33.0/commands
bash $commands/s10/retree.sh
cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/ongpu; t0=$SECONDS
source $commands/switch_arm.sh
arm() { switch_arm "$1" "$2" $OUT/ongpu --models 2 --switches ${SWITCHES:-6} "${@:3}"; }
gib=${GIB:-7}
arm whole 200 --cache /root/cc/ongpu
export VLLM_CACHE_ROOT=/root/cc/ongpu/vllm TORCHINDUCTOR_CACHE_DIR=/root/cc/ongpu/inductor TRITON_CACHE_DIR=/root/cc/ongpu/triton
for a in "gpu$gib --layered-wake --weights-on-gpu-gib $gib" "layered --layered-wake" \
         "gpu$gib-whole --weights-on-gpu-gib $gib"; do
  left=$((LIMIT - (SECONDS - t0) - 15))
  [ $left -gt 100 ] || { echo "${a%% *}: skipped ($left s left)"; continue; }
  # shellcheck disable=SC2086
  set -- $a; name=$1; shift
  arm "$name" "$left" "$@"
done
python3 $commands/s17/same_across.py --out $OUT/ongpu/same.json $OUT/ongpu/whole.json $OUT/ongpu/gpu*.json $OUT/ongpu/layered.json
grep -h "stay on the GPU" $OUT/ongpu/*.log | sed -E 's/.*vllm-offload/vllm-offload/' | sort | uniq -c | head -4
(cd $OUT/ongpu && tar -cJf ongpu-logs.tar.xz ./*.log 2>/dev/null && rm -f ./*.log)
echo "weights_on_gpu.sh done in $((SECONDS-t0)) s"
