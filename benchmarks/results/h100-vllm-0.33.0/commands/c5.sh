#!/bin/bash
# call 5: a CPU hit, GPU hit, recompute: 0005 (layer-wise, on 0.33's sync loads) vs 0.33's
# own sync loads vs async loads (vLLM's default) vs no tier, arms interleaved
set -u; t0=$SECONDS
[ -f .gpu/port33/src.tar.gz ] && rm -rf /root/src && mkdir -p /root/src && tar -C /root/src -xzf .gpu/port33/src.tar.gz
cd /root/src
# a bench case of our own, with release.sh's helpers (bench(), leftovers, keylines)
sed -n '1,/^case \$case in/p' benchmarks/gpu/release.sh | sed '$d' > /root/rel-head.sh
cat /root/rel-head.sh - > /root/c5-run.sh <<'SH'
patch apply
# one H100 (80 GB): three 8B servers at once, 0.3 of the GPU each, 4 GiB pools
timeout -k 10 $(($(left) - 15)) python3 -m vllm_offload bench --model $model \
  --repeats ${REPEATS:-3} --pool-bytes $((4 << 30)) --gpu-memory-utilization 0.3 --token-ids \
  --h2d-gbps "$h2d" --tier-gib 16 --out "$out/hits" --arms native \
  --arm 'sync=native --kv-offload-layerwise-loads false --kv-offload-sync-load-budget-gib 4' \
  --arm 'async=native --kv-offload-layerwise-loads false' \
  --workloads reuse,memory --docs 8 --doc-tokens 8000 --settle-seconds 0.5 -- "${dummy[@]}"
leftovers
dir=$out/hits; [ -f "$dir/results.json" ] && rm -f "$dir/results.partial.json"; rm -f "$dir"/summary.csv "$dir"/*.png; keylines "$dir"
find "$out" -type f | sort | xargs ls -la
SH
LMSITE=/root/vo SITE=/root/site OUT=$OUT/c5 DEADLINE=570 bash /root/c5-run.sh 0.33.0 hits 2>&1 | tail -45
echo "call done in $((SECONDS-t0)) s"
