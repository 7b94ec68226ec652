#!/bin/bash
# call 4: the host extension's exactness on 0.33.0 (random weights std 0.02 + its control)
set -u; t0=$SECONDS; repo=$PWD
[ -f .gpu/port33/src.tar.gz ] && rm -rf /root/src && mkdir -p /root/src && tar -C /root/src -xzf .gpu/port33/src.tar.gz
cd /root/src
python3 -m vllm_offload patch status --site /root/site 2>&1 | tail -1 || true
LMSITE=/root/vo SITE=/root/site OUT=$OUT/c4 RANDOM_WEIGHTS_STD=0.02 DEADLINE=560 \
  HOST_EXTENSION_ARGS="--arms reference,extended --long-tokens 32768 --extension-gib 4 --reference-gib 6 --short-repeats 2" \
  bash benchmarks/gpu/release.sh 0.33.0 host-extension 2>&1 | tail -40
python3 - <<'PY' $OUT/c4/host-extension/host_extension.json
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print(json.dumps({k: d.get(k) for k in ("mapping_check", "control", "same_tokens", "same_logprobs", "max_logprob_diff")}, indent=1)[:3000])
    for n, a in d.get("arms", {}).items():
        print(n, {k: v for k, v in a.items() if k not in ("long", "shorts")})
except Exception as e:
    print("no json", e)
PY
echo "call done in $((SECONDS-t0)) s"
