#!/bin/bash
# The last part staged, the host made ready (benchmarks/gpu/host_setup.sh), this tree kept
# at /root/repo for the later calls of the machine (they run what this call ran).
set -u
cp .gpu/bundle/part_ac /root/stage/
rm -rf /root/repo && mkdir -p /root/repo && cp -a benchmarks vllm_offload testkit pyproject.toml /root/repo/ 2>/dev/null
cd /root/repo && bash benchmarks/gpu/host_setup.sh > /root/setup.txt 2>&1; tail -5 /root/setup.txt
