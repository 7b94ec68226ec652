#!/usr/bin/env bash
# Issue #13 on the GPU host: benchmarks/gpu/capacity.py for one release whose bundle is
# unpacked in SITE (../shared/gpu-bundle), with that release's patch series applied.
#   benchmarks/gpu/capacity.sh 0.32.0 /root/site
#   benchmarks/gpu/capacity.sh 0.25.0 /root/site025
set -uo pipefail
release=${1:?release}
site=${2:?site-packages directory of the unpacked bundle}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m vllm_offload patch apply --site "$site"
{ nvidia-smi --query-gpu=name,memory.total --format=csv; free -g; df -h /dev/shm; ulimit -l; } \
  > "$out/host-$release.txt" 2>&1
python3 benchmarks/gpu/capacity.py --release "$release" --out "$out/capacity-$release"
