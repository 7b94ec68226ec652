#!/bin/bash
# unpack + patch (4 parts in /root/stage), then the Llama-3-8B-shaped random checkpoint
set -u; t0=$SECONDS
bash .gpu/fork/sh/unpack.sh > $OUT/unpack.txt 2>&1 || { cat $OUT/unpack.txt; exit 1; }
tail -4 $OUT/unpack.txt
source .gpu/fork/sh/env.sh
python3 benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3-8b/config.json /root/ckpt-llama-3-8b > $OUT/ckpt.txt 2>&1; echo "ckpt rc=$?"; tail -2 $OUT/ckpt.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; free -g | head -2
echo "setup done in $((SECONDS-t0)) s"
