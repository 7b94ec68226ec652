#!/bin/bash
# dense shapes' planned GPU pools against vLLM's "Available KV cache memory" (CUDA graphs,
# dummy weights): SHAPES="name:util ..." (benchmarks/models/NAME)
set -u; source .gpu/fork/sh/env.sh; export PYTHONSAFEPATH=1; d=$OUT/dense; mkdir -p $d
for item in ${SHAPES:-llama-3.2-1b:0.3 llama-3.2-3b:0.3 llama-3-8b:0.25}; do
  name=${item%%:*}; util=${item##*:}; tag=$name-$util; cfg=$d/$tag.toml
  printf 'extra_args = ["--skip-tokenizer-init", "--load-format", "dummy"]\n[model]\npath = "%s"\nmax_model_len = 8192\n[gpu]\nmemory_utilization = %s\n[kv_offload]\nbackend = "none"\n[server]\nport = 8400\n' "$PWD/benchmarks/models/$name" $util > $cfg
  python3 -m vllm_offload plan --config $cfg > $d/plan-$tag.txt 2>&1; echo "$tag plan rc=$?"
  grep -E "GPU KV pool" $d/plan-$tag.txt
  setsid python3 -m vllm_offload serve --config $cfg > $d/serve-$tag.log 2>&1 &
  pid=$!; t0=$SECONDS
  until grep -q "Available KV cache memory" $d/serve-$tag.log || ((SECONDS - t0 > ${SERVE_S:-150})) || ! kill -0 $pid 2>/dev/null; do sleep 2; done
  echo "$tag: after $((SECONDS-t0)) s"
  grep -hE "Available KV|Model loading took|Graph capturing|equivalent to" $d/serve-$tag.log | cut -c1-200
  kill -TERM -$pid; sleep 5; pkill -9 -f EngineCore; pkill -9 -f vllm_offload; sleep 2
done
(cd $d && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
