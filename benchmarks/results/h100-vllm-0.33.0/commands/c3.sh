#!/bin/bash
# call 3: unpack 0.33.0, patch status/apply, `vllm-offload serve` with no config
set -u
t0=$SECONDS; repo=$PWD
cp .gpu/port33/bundle/part_ac /root/stage/ && cd /root/stage && cat part_a? > b.tar.xz && mkdir -p /root/site && tar -C /root/site -xJf b.tar.xz && rm b.tar.xz
mkdir -p /root/src && tar -C /root/src -xzf /root/stage/src.tar.gz
info=/root/vo/vllm_offload-0.1.0.dist-info; mkdir -p $info /root/vo/bin
printf 'Metadata-Version: 2.1\nName: vllm-offload\nVersion: 0.1.0\n' > $info/METADATA
printf '[vllm.general_plugins]\nvllm_offload = vllm_offload.vllm_ext.plugin:register\n' > $info/entry_points.txt
printf '#!/bin/bash\nexec python3 -m vllm_offload "$@"\n' > /root/vo/bin/vllm-offload; chmod +x /root/vo/bin/vllm-offload
source $repo/.gpu/port33/env.sh
echo "unpacked in $((SECONDS-t0)) s"; ls /root/site | grep -i "^vllm-"
cd /root/src
out=$OUT/c3; mkdir -p $out
{ echo "== $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; free -g; df -h /dev/shm; ulimit -l
  python3 -c 'import torch, vllm; print("torch", torch.__version__, "vllm", vllm.__version__)'
  echo "== patch status (fresh)"; vllm-offload patch status --site /root/site; echo "rc=$?"
  echo "== patch apply"; vllm-offload patch apply --site /root/site; echo "rc=$?"
  echo "== patch status"; vllm-offload patch status --site /root/site; echo "rc=$?"
} > $out/patch.txt 2>&1
cat $out/patch.txt
# serve with no config: the demo model, today's defaults
setsid vllm-offload serve > $out/serve.log 2>&1 & pid=$!; t1=$SECONDS; ok=0
for i in $(seq 1 200); do sleep 2; curl -sf localhost:8000/health >/dev/null && { ok=1; break; }; done
echo "healthy=$ok after $((SECONDS-t1)) s" | tee $out/serve-result.txt
curl -s localhost:8000/v1/models >> $out/serve-result.txt; echo >> $out/serve-result.txt
m=$(curl -s localhost:8000/v1/models | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' -d "{\"model\": \"$m\", \"prompt\": \"hello world\", \"max_tokens\": 8}" >> $out/serve-result.txt; echo >> $out/serve-result.txt
curl -s localhost:8000/metrics | grep -c "^vllm" >> $out/serve-result.txt
cat $out/serve-result.txt
kill -TERM -- -$pid; for i in $(seq 1 30); do kill -0 -- -$pid 2>/dev/null || break; sleep 1; done; kill -9 -- -$pid 2>/dev/null; sleep 1
grep -E "KV cache capacity|GPU pool :|CPU tier|reusable|host arena|Traceback|Error" $out/serve.log | cut -c1-300 | head -30
echo "call done in $((SECONDS-t0)) s"
