#!/bin/bash
# s9/setup.sh with the bundle in four parts (the tree grew past 64 MiB beside a 55 MB
# part): the last part staged, the host made ready, this tree kept at /root/repo.
set -u
cp .gpu/bundle/part_ad /root/stage/
rm -rf /root/repo && mkdir -p /root/repo && cp -a benchmarks vllm_offload testkit pyproject.toml /root/repo/ 2>/dev/null
cd /root/repo && bash benchmarks/gpu/host_setup.sh > /root/setup.txt 2>&1; tail -5 /root/setup.txt
