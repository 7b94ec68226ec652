#!/bin/bash
# the two-model switch with the arena's old wake (serial) and the new one (pipelined), one
# after the other on this host; the micro-benchmark first
set -u; base=$OUT
mkdir -p $OUT/wake; source .gpu/fork/sh/env.sh
PYTHONSAFEPATH=1 timeout -k 10 120 python3 benchmarks/gpu/wake_bench.py --config benchmarks/models/llama-3-8b/config.json \
  --rounds 10 --out $OUT/wake/wake.json 2>&1 | grep -v "^INFO" | tail -6
rm -rf /root/serial-tree; mkdir -p /root/serial-tree
tar --exclude=./.gpu/fork/bundle -cf - . | tar -C /root/serial-tree -xf -
cp .gpu/s7/sleep_serial.py /root/serial-tree/vllm_offload/vllm_ext/sleep.py
for arm in ${AB:-serial pipelined}; do
  dir=$PWD; [ $arm = serial ] && dir=/root/serial-tree
  (cd $dir && OUT=$base/$arm ARMS=sleep1 ARM_S=${ARM_S:-250} bash .gpu/s6/switch.sh 2>&1 | grep -E "switch to|healthy|rc=" )
  tar -xJOf $base/$arm/switch/switch-logs.tar.xz | grep -a "sleep arena" | grep woke | cut -c1-220 | tail -4
done
