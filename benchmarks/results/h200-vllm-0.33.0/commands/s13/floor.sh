#!/bin/bash
# Issue #58: the driver's process checkpoint on a process holding what a sleeping engine
# keeps (benchmarks/gpu/checkpoint_floor.py; torch and pynvml, after the bundle is staged).
set -u; cd /root/repo && source /root/vo/env.sh; mkdir -p $OUT/floor
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${LIMIT:-240} python3 benchmarks/gpu/checkpoint_floor.py --out $OUT/floor --rounds 3 --keep-gib 2
echo "rc $?"
