#!/bin/bash
# unpack + patch, the random Llama-3-8B checkpoint (std 0.02) at /root/ckpt-llama-3-8b
set -u; t0=$SECONDS
bash .gpu/fork/sh/unpack.sh > $OUT/unpack.txt 2>&1 || { cat $OUT/unpack.txt; exit 1; }
tail -3 $OUT/unpack.txt; source .gpu/fork/sh/env.sh
python3 benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3-8b/config.json /root/ckpt-llama-3-8b --std 0.02 2>&1 | tail -1
ln -sfn /root/ckpt-llama-3-8b /root/ckpt-llama-3-8b-std0.02  # release.sh's fleet_setup name
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
echo "setup done in $((SECONDS-t0)) s"
