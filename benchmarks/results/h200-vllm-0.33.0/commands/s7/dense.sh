#!/bin/bash
# a dense Llama-3-8B plan's GPU pool against vLLM's "Available KV cache memory" (CUDA graphs)
set -u; source .gpu/fork/sh/env.sh; export PYTHONSAFEPATH=1; d=$OUT/dense; mkdir -p $d
for util in ${UTILS:-0.42}; do
  cfg=$d/dense-$util.toml
  printf 'extra_args = ["--skip-tokenizer-init"]\n[model]\npath = "/root/ckpt-llama-3-8b"\n[gpu]\nmemory_utilization = %s\n[server]\nport = 8400\n' $util > $cfg
  python3 -m vllm_offload plan --config $cfg > $d/plan-$util.txt 2>&1; echo "plan rc=$?"
  grep -E "GPU KV pool|weights  |chose: gpu" $d/plan-$util.txt
  setsid python3 -m vllm_offload serve --config $cfg > $d/serve-$util.log 2>&1 &
  pid=$!; t0=$SECONDS
  until curl -sf localhost:8400/health >/dev/null || ((SECONDS - t0 > ${SERVE_S:-200})) || ! kill -0 $pid 2>/dev/null; do sleep 2; done
  echo "util $util: up after $((SECONDS-t0)) s"
  grep -hE "Available KV|GPU KV cache size|Model loading took|Graph capturing|peak|memory profiling" $d/serve-$util.log | cut -c1-260
  kill -TERM -$pid; sleep 8; pkill -9 -f EngineCore; pkill -9 -f vllm_offload; sleep 2
done
(cd $d && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
