#!/bin/bash
# Call 1 of a machine: the bundle's first part staged, the seeded random Llama-3.1-8B
# checkpoint (std 0.02) written, a hash of its first shard's first 256 MiB (the same
# checkpoint on every H200: answers of one machine are a reference on the next).
set -u; t0=$SECONDS
mkdir -p /root/stage && cp .gpu/bundle/part_aa /root/stage/
python3 benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3.1-8b/config.json \
  /root/ckpt-llama-3.1-8b --std 0.02 --seed 0 2>&1 | tail -2
head -c 268435456 /root/ckpt-llama-3.1-8b/model-00000.safetensors | sha256sum | tee $OUT/ckpt-sha.txt
echo "call 1 done in $((SECONDS-t0)) s"
