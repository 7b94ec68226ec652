#!/bin/bash
# #42 part 1: chats beside a spilled request. Big card (H200): gpu-only / share-1 / share-0.25 / share-0.5, 4 servers at 0.22;
# an 80 GB card: 3 servers at 0.3, share 0.25 only
set -u; t0=$SECONDS; source .gpu/fork/sh/env.sh
total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$total" -gt 120000 ]; then extra="--shares 0.1,0.25,0.5 --utilization 0.18 --long-out 200"; else extra=""; fi
echo "gpu MiB $total extra: $extra"
timeout -k 10 ${LIMIT:-575} python3 benchmarks/gpu/fairness.py --out $OUT/fair $extra 2>&1 | grep -v Warning | tail -60
echo "fair done in $((SECONDS-t0)) s"
