#!/usr/bin/env bash
# Issue #3/#4 measurements on the GPU host (vLLM 0.25.0 bundle unpacked in /root/site):
#   benchmarks/gpu/patch_memory.sh tier     # S0 plan vs vLLM, S1/S2 40 GiB KV tier patched/unpatched
#   benchmarks/gpu/patch_memory.sh weights  # S3/S4 8 GiB UVA weight offload, pinned_memory.py
# Each server: Llama-3-8B shape, dummy weights, started through `vllm-offload serve`.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/root/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
model=benchmarks/models/llama-3-8b
dummy=(--load-format dummy --skip-tokenizer-init --enforce-eager)
run() { python3 benchmarks/server_memory.py --out "$out" "$@"; }
patch() { python3 -m vllm_offload patch "$1" --site /root/site; }
{ nvidia-smi --query-gpu=name,memory.total --format=csv; free -g; df -h /dev/shm; ulimit -l; } \
  > "$out/host.txt" 2>&1
case "${1:?tier|weights}" in
tier)
  patch apply
  run --name s0-patched-none -- --model $model --kv-offload-backend none -- "${dummy[@]}"
  run --name s1-patched-tier40 -- --model $model --kv-offload-backend native \
      --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
  patch revert
  VLLM_LOGGING_LEVEL=DEBUG run --name s2-unpatched-tier40 -- --model $model --allow-unpatched \
      --kv-offload-backend native --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
  ;;
weights)
  patch apply
  run --name s3-patched-w8 -- --model $model --kv-offload-backend none \
      --weights-offload-cpu-gib 8 -- "${dummy[@]}"
  patch revert
  run --name s4-unpatched-w8 -- --model $model --allow-unpatched --kv-offload-backend none \
      --weights-offload-cpu-gib 8 -- "${dummy[@]}"
  python3 benchmarks/pinned_memory.py --out "$out/pinned_memory.json"
  ;;
esac
for f in "$out"/*.log; do grep -E "Error|error:|Traceback" "$f" | head -5; done
