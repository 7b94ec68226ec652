#!/bin/bash
# A later call of a machine at a newer tree: this call's tree replaces /root/repo's
# (the patch series applied at setup stays; env.sh points at /root/repo).
set -u
rm -rf /root/repo/benchmarks /root/repo/vllm_offload /root/repo/testkit
cp -a benchmarks vllm_offload testkit pyproject.toml /root/repo/
