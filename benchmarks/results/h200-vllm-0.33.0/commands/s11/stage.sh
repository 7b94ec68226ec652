#!/bin/bash
# One part of the bundle (carried in .gpu/bundle/) appended to /root/stage; on the call
# that carries the last part, the host is made ready too (SETUP=1).
set -u
mkdir -p /root/stage && cp .gpu/bundle/part_* /root/stage/ && ls -l /root/stage
if [ "${SETUP:-0}" = 1 ]; then
  rm -rf /root/repo && mkdir -p /root/repo
  cp -a benchmarks vllm_offload testkit pyproject.toml /root/repo/
  (cd /root/repo && bash benchmarks/gpu/host_setup.sh > /root/setup.txt 2>&1); tail -5 /root/setup.txt
fi
