#!/bin/bash
set -u; source .gpu/fork/sh/env.sh
timeout -k 10 ${LIMIT:-560} python3 benchmarks/gpu/layerwise_check.py --out $OUT/layerwise-random \
  --checkpoint /root/ckpt-llama-3-8b ${LW_FLAGS:-} 2>&1 | grep -v "^INFO\|^(" | tail -20
(cd $OUT/layerwise-random && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
