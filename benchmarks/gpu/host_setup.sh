#!/usr/bin/env bash
# A bare GPU host made ready (see README.md beside this): the vLLM bundle's parts in STAGE
# (default /root/stage, one part carried per device call and appended there) unpacked into
# SITE (default /root/site); the plugin's dist-info in VO (default /root/vo: vLLM loads our
# plugin only through the package's entry point, else it silently runs without it); this
# tree's patch series applied; VO/env.sh written for later calls to source:
#   bash benchmarks/gpu/host_setup.sh && source /root/vo/env.sh
set -u
stage=${STAGE:-/root/stage} site=${SITE:-/root/site} vo=${VO:-/root/vo} repo=$PWD
t0=$SECONDS
ls -l "$stage"
if [ ! -d "$site/vllm" ]; then
  cat "$stage"/part_* | xz -dc -T0 | (mkdir -p "$site" && tar -C "$site" -xf -) || { echo "UNPACK FAILED"; exit 1; }
fi
info=$vo/vllm_offload-0.1.0.dist-info
mkdir -p "$info" "$vo/bin"
printf 'Metadata-Version: 2.1\nName: vllm-offload\nVersion: 0.1.0\n' > "$info/METADATA"
printf '[vllm.general_plugins]\nvllm_offload = vllm_offload.vllm_ext.plugin:register\n' > "$info/entry_points.txt"
printf '#!/bin/bash\nexec python3 -m vllm_offload "$@"\n' > "$vo/bin/vllm-offload"
chmod +x "$vo/bin/vllm-offload"
cat > "$vo/env.sh" <<ENV
export PYTHONPATH=$vo:$repo:$site VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export PATH=$vo/bin:\$PATH
ENV
# shellcheck disable=SC1091
source "$vo/env.sh"
python3 -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)' 2>&1 | tail -1
python3 -m vllm_offload patch apply --site "$site" 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "host ready in $((SECONDS - t0)) s"
