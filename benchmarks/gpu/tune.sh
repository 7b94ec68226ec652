#!/usr/bin/env bash
# Issue #4/#7 follow-up on the GPU host (vLLM 0.25.0 bundle in /root/site):
# pinned_memory.py with CUDA-graph block copies, then reuse TTFT with 256-token CPU chunks
# (16 GPU blocks per offloaded chunk) against the baseline, 3 interleaved repeats.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/root/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m vllm_offload patch apply --site /root/site
python3 benchmarks/pinned_memory.py --tensors 4 --tensor-gib 1.25 --out "$out/pinned_memory.json"
timeout 400 python3 -m vllm_offload bench --model benchmarks/models/llama-3-8b \
  --arms baseline,native --workloads reuse,memory --repeats 3 --docs 8 --doc-tokens 8000 \
  --tier-gib 16 --pool-bytes $((4 << 30)) --gpu-memory-utilization 0.4 \
  --serve-flags="--kv-offload-block-size 16 --kv-offload-cpu-chunk-tokens 256" \
  --token-ids --h2d-gbps 55.4 --out "$out/chunk256" \
  -- --load-format dummy --skip-tokenizer-init --enforce-eager
rm -f "$out"/chunk256/*.png "$out"/chunk256/summary.csv
