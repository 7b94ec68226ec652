#!/bin/bash
# call 7: the 40 GiB CPU tier's RAM and set-up time on 0.33.0, patched (0004's 4 populate
# threads) vs unpatched; unpack first (a fresh machine)
set -u; t0=$SECONDS; repo=$PWD
cp .gpu/port33/bundle/part_ac /root/stage/ && cd /root/stage && cat part_a? > b.tar.xz && mkdir -p /root/site && tar -C /root/site -xJf b.tar.xz && rm b.tar.xz
rm -rf /root/src && mkdir -p /root/src && tar -C /root/src -xzf /root/stage/src.tar.gz
info=/root/vo/vllm_offload-0.1.0.dist-info; mkdir -p $info
printf 'Metadata-Version: 2.1\nName: vllm-offload\nVersion: 0.1.0\n' > $info/METADATA
printf '[vllm.general_plugins]\nvllm_offload = vllm_offload.vllm_ext.plugin:register\n' > $info/entry_points.txt
cd /root/src
sed -n '1,/^case \$case in/p' benchmarks/gpu/release.sh | sed '$d' > /root/c7-run.sh
cat >> /root/c7-run.sh <<'SH'
export VLLM_LOGGING_LEVEL=DEBUG VLLM_LOGGING_PREFIX='%(msecs)03d '
patch apply
sm --name s1-patched-tier40 -- --model $model --kv-offload-backend native \
  --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
patch revert
sm --name s2-unpatched-tier40 -- --model $model --allow-unpatched \
  --kv-offload-backend native --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
patch apply
keylines "$out"
grep -hE "MADV_POPULATE|Created mmap|pin|egister|CPU tier check" "$out"/server-lines.txt | cut -c1-220 | head -20
find "$out" -type f | sort | xargs ls -la
SH
LMSITE=/root/vo SITE=/root/site OUT=$OUT/c7 DEADLINE=500 bash /root/c7-run.sh 0.33.0 tier 2>&1 | tail -40
for f in $OUT/c7/s*.json; do python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: d.get(k) for k in ('healthy_s','host_ram_gib','host_ram_bytes','tier_bytes')})" $f; done
echo "call done in $((SECONDS-t0)) s"
