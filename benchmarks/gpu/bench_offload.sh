#!/usr/bin/env bash
# Issue #7 on the GPU host (vLLM 0.25.0 bundle unpacked in /root/site): baseline vs the
# native CPU KV tier, both servers side by side on one GPU (same model, same 4 GiB GPU
# pool), workloads interleaved and repeated 3 times. H2D bandwidth for the CPU-hit floor
# is the registered-buffer figure from benchmarks/pinned_memory.py on the same machine.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/root/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m vllm_offload patch apply --site /root/site
timeout 520 python3 -m vllm_offload bench --model benchmarks/models/llama-3-8b \
  --arms baseline,native --repeats 3 \
  --docs 8 --doc-tokens 8000 \
  --conversations 8 --turns 3 --turn-tokens 1500 \
  --rates sync,8,32 --rate-seconds 6 --prompt-tokens 512 --output-tokens 64 \
  --tier-gib 16 --pool-bytes $((4 << 30)) --gpu-memory-utilization 0.4 \
  --serve-flags="--kv-offload-block-size 16 --kv-offload-cpu-chunk-tokens 16" \
  --token-ids --h2d-gbps 55.4 --out "$out/bench" \
  -- --load-format dummy --skip-tokenizer-init --enforce-eager
for f in "$out"/bench/*.log; do grep -E "Error|error:" "$f" | grep -v "Tokenizer not available" | head -3; done
