#!/bin/bash
set -u; source .gpu/fork/sh/env.sh; mkdir -p /root/kvdisk
timeout -k 10 ${LIMIT:-560} python3 benchmarks/gpu/disk_tier.py --out $OUT/disk-tier --disk /root/kvdisk \
  --arms ${DISK_ARMS:-none,cpu,cpu+disk,restart,bound} 2>&1 | grep -v "^INFO\|^(" | tail -20
(cd $OUT/disk-tier && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
