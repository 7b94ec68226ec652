#!/bin/bash
# #39 item 3: the real model through a CPU-tier hit, sleep/wake, fp8 KV, and against the float32 reference
set -u; source .gpu/fork/sh/env.sh
export PYTHONPATH=$PYTHONPATH:/root/stage/gguf-site VLLMOFFLOAD_CACHE=/root/stage/cache
timeout -k 10 470 python3 benchmarks/gpu/real_model_paths.py --model /root/smollm2 --out $OUT/paths 2>&1 | grep -v Warning | tail -40
