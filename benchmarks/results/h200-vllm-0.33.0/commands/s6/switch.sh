#!/bin/bash
# two models through the front door, one arm a server: ARMS="sleep1 sleep2 sleep1-vllm"
set -u; source .gpu/fork/sh/env.sh; mkdir -p $OUT/switch
for arm in ${ARMS:-sleep1 sleep2}; do
  case $arm in
  sleep1) flags=(--idle sleep --level 1) ;;
  sleep1-vllm) flags=(--idle sleep --level 1 --arena 0) ;;
  sleep2) flags=(--idle sleep --level 2) ;;
  esac
  t0=$SECONDS
  timeout -k 10 ${ARM_S:-290} python3 benchmarks/gpu/switch.py --checkpoint /root/ckpt-llama-3-8b \
    --out $OUT/switch/switch-$arm.json "${flags[@]}" 2>&1 | grep -v "^INFO\|^(" | tail -30
  echo "$arm: rc=${PIPESTATUS[0]} in $((SECONDS-t0)) s"
  pkill -9 -f vllm_offload; pkill -9 -f EngineCore; sleep 3
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
(cd $OUT/switch && tar -cJf switch-logs.tar.xz ./*.log && rm -f ./*.log)
