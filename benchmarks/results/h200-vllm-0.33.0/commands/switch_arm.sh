#!/bin/bash
# Sourced by call scripts that run benchmarks/gpu/switch.py arms one after another on the
# GPU host (in /root/repo, env.sh sourced). switch_arm NAME SECONDS DIR switch.py-flags...
# runs one arm on the seeded random 8B checkpoint into DIR/NAME.json (its server's logs
# beside it), prints its tail and exit code, and leaves no engine behind.
switch_arm() {
  local name=$1 limit=$2 dir=$3; shift 3; local t=$SECONDS
  timeout -k 10 "$limit" python3 benchmarks/gpu/switch.py --checkpoint /root/ckpt-llama-3.1-8b \
    --out "$dir/$name.json" "$@" 2>&1 | grep -v "^INFO\|^(\|^WARNING\|^DEBUG" | tail -8
  echo "$name: rc=${PIPESTATUS[0]} in $((SECONDS - t)) s"
  pkill -9 -f vllm_offload; pkill -9 -f EngineCore; sleep 3
}
