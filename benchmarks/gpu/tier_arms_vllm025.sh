#!/usr/bin/env bash
# Issue #7 follow-up on the GPU host (vLLM 0.25.0 bundle unpacked in /root/site), one
# call each, back to back:
#   tier_arms_vllm025.sh kv-patched    # baseline vs native tier (16- and 256-token chunks, store
#                             # threshold 2), reuse with a settle pause, saturated + 16 req/s
#   tier_arms_vllm025.sh weights       # decode speed with 8 GiB of weights offloaded: UVA vs prefetch
#   tier_arms_vllm025.sh kv-unpatched  # the same KV arms on unpatched vLLM (torch-pinned tier)
#   tier_arms_vllm025.sh breakdown     # reuse with the server's own timings (queue, prefill, load
#                             # bytes and time) for 16/256/1024-token chunks, and chat
#   tier_arms_vllm025.sh blocks        # GPU block size 16/64/128 tokens under 256-token CPU chunks
# Llama-3-8B shape, dummy weights; the arms run side by side on the one GPU, each with a
# 4 GiB GPU KV pool; 55.4 GB/s is the registered-buffer H2D figure of pinned_memory.py.
# These runs chose today's defaults, so the arms pin what was measured: `native` is the
# old default (16-token blocks and chunks), `c256`/`c1024` keep 16-token blocks.
set -uo pipefail
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=/root/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
bench() {
  timeout "$1" python3 -m vllm_offload bench --model benchmarks/models/llama-3-8b \
    --repeats 3 --pool-bytes $((4 << 30)) --gpu-memory-utilization 0.22 --token-ids \
    --h2d-gbps 55.4 --tier-gib 16 --out "$out/$2" "${@:3}" \
    -- --load-format dummy --skip-tokenizer-init --enforce-eager
}
b16="--kv-offload-block-size 16"
kv_workloads=(--workloads reuse,sweep,memory --docs 8 --doc-tokens 8000 --settle-seconds 0.5
  --rates max,16 --rate-seconds 7 --max-concurrency 48 --prompt-tokens 512 --output-tokens 64)
case "${1:?kv-patched|weights|kv-unpatched|breakdown|blocks}" in
kv-patched)
  python3 -m vllm_offload patch apply --site /root/site
  bench 470 kv-patched --arms baseline --arm "native=native $b16 --kv-offload-cpu-chunk-tokens 16" \
    --arm "c256=native $b16 --kv-offload-cpu-chunk-tokens 256" \
    --arm "c256t2=native $b16 --kv-offload-cpu-chunk-tokens 256 --kv-offload-store-threshold 2" \
    "${kv_workloads[@]}"
  ;;
weights)
  python3 -m vllm_offload patch apply --site /root/site
  bench 500 weights --arms baseline --arm "uva8=baseline --weights-offload-cpu-gib 8" \
    --arm "pf8=baseline --weights-offload-cpu-gib 8 --weights-offload-backend prefetch" \
    --arm "pf8s2=baseline --weights-offload-cpu-gib 8 --weights-offload-backend prefetch \
--weights-offload-prefetch-step 2" \
    --workloads decode,memory --decode-batch 16 --prompt-tokens 128 --output-tokens 64
  ;;
kv-unpatched)
  python3 -m vllm_offload patch revert --site /root/site
  bench 500 kv-unpatched --serve-flags=--allow-unpatched --arms baseline \
    --arm "native=native $b16 --kv-offload-cpu-chunk-tokens 16" \
    --arm "c256=native $b16 --kv-offload-cpu-chunk-tokens 256" "${kv_workloads[@]}"
  ;;
breakdown)
  python3 -m vllm_offload patch apply --site /root/site
  bench 500 breakdown --arms baseline --arm "native=native $b16 --kv-offload-cpu-chunk-tokens 16" \
    --arm "c256=native $b16 --kv-offload-cpu-chunk-tokens 256" \
    --arm "c1024=native $b16 --kv-offload-cpu-chunk-tokens 1024" \
    --workloads reuse,chat,memory --docs 8 --doc-tokens 8000 --settle-seconds 0.5 \
    --conversations 8 --turns 3 --turn-tokens 1500 --output-tokens 16
  ;;
blocks)
  python3 -m vllm_offload patch apply --site /root/site
  bench 480 blocks --arms baseline \
    --arm "c256=native $b16 --kv-offload-cpu-chunk-tokens 256" \
    --arm "b64=native --kv-offload-block-size 64 --kv-offload-cpu-chunk-tokens 256" \
    --arm "b128=native --kv-offload-block-size 128 --kv-offload-cpu-chunk-tokens 256" \
    --workloads reuse,sweep,memory --docs 8 --doc-tokens 8000 --settle-seconds 0.5 \
    --rates max --rate-seconds 6 --max-concurrency 48 --prompt-tokens 512 --output-tokens 64
  ;;
esac
# At most 8 files come back: the results, the summary, the plots, the servers' key lines.
cd "$out"/*/ || exit 1
[ -f results.json ] && rm -f results.partial.json
grep -HE "KV cache size|Registered|registered|offloaded|Offloader|pinned|Error|error:" ./*.log \
  | grep -v "Tokenizer not available" | cut -c1-400 > server-lines.txt
rm -f ./*.log summary.csv
ls -la
