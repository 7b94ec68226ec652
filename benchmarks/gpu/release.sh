#!/usr/bin/env bash
# Issue #16: one vLLM release (its bundle unpacked in SITE, default /root/site; the plugin's
# dist-info in VO, default /root/vo; random checkpoints in CHECKPOINTS, default /root) measured
# on the GPU host through the project's own scripts; one device call per case, back to back:
#   benchmarks/gpu/release.sh 0.32.0 pinned   # pinned_memory.py: registered vs torch-pinned
#                                             # host buffers (the H2D figure for the others)
#   benchmarks/gpu/release.sh 0.32.0 tier     # S0 patched no tier, S1 patched 40 GiB native
#                                             # tier, S2 unpatched 40 GiB tier (DEBUG logs,
#                                             # millisecond stamps for populate/register)
#   benchmarks/gpu/release.sh 0.32.0 weights  # 8 GiB weight offload: UVA patched (S3) and
#                                             # unpatched (S4), prefetch patched (S5) and
#                                             # unpatched (S6)
#   benchmarks/gpu/release.sh 0.32.0 weights-files  # S3, S5, S6 from real (random) weight
#                                             # files instead of dummy weights
#   benchmarks/gpu/release.sh 0.32.0 decode   # bench decode,memory: baseline / uva8 / pf8
#   benchmarks/gpu/release.sh 0.32.0 kill9    # kill9.py patched, then unpatched
#   benchmarks/gpu/release.sh 0.32.0 reuse    # bench baseline vs native, today's defaults
# Issue #19 (patch 0005, layer-wise CPU-tier loads):
#   benchmarks/gpu/release.sh 0.32.0 layerwise  # layerwise_check.py: a CPU hit loads the
#                                             # whole document, tokens == a GPU hit's
#   benchmarks/gpu/release.sh 0.32.0 layerwise-graphs  # the same with CUDA graphs, a
#                                             # one-token hit beside a decode (full graph)
#   benchmarks/gpu/release.sh 0.32.0 hits     # bench reuse: baseline / native (layer-wise) /
#                                             # async (vLLM's own loads), 5 repeats
#   benchmarks/gpu/release.sh 0.32.0 saturated  # bench sweep at 0 % reuse: baseline vs
#                                             # native, 8 repeats of 20 s
#   benchmarks/gpu/release.sh 0.32.0 saturated-graphs  # the same with CUDA graphs (how
#                                             # users run; eager steps are CPU-bound and
#                                             # spread +-10 % between windows), REPEATS
#                                             # (default 20) pairs of 8 s
#   benchmarks/gpu/release.sh 0.32.0 saturated-blocks  # the same, three arms: baseline,
#                                             # baseline with the native tier's 128-token
#                                             # blocks (b128), native; REPEATS (default 14)
# Issue #33 (GPU block size x CPU-tier chunk under layer-wise loads; CUDA graphs on):
#   benchmarks/gpu/release.sh 0.32.0 blocks   # swap_blocks.py (the load copies alone, by
#                                             # block size), then bench reuse with
#                                             # --hit-concurrency 1,8: CPU hits one at a
#                                             # time and 8 at once, arms baseline /
#                                             # b128c256 (today's default) / b16c256 /
#                                             # b32c256, 8 GiB pools (8 documents fit),
#                                             # REPEATS (default 3)
#   benchmarks/gpu/release.sh 0.32.0 blocks-saturated  # 0 % reuse at saturation:
#                                             # baseline / b128c256 / b16c256, REPEATS
#                                             # (default 14) triples of 8 s
# Issue #22 (patch 0006, the KV pool's host extension):
#   benchmarks/gpu/release.sh 0.32.0 host-extension  # host_extension.py: a 64k-token request
#                                             # on a 2 GiB GPU pool + 8 GiB of host RAM,
#                                             # tokens and logprobs against a 12 GiB pool
#                                             # (HOST_EXTENSION_ARGS: more of its flags;
#                                             # RANDOM_WEIGHTS_STD=0.02: random weights
#                                             # whose output follows the context)
# Issue #31 (several models, through `vllm-offload serve`'s front door):
#   ARMS="sleep1 sleep1-vllm" benchmarks/gpu/release.sh 0.32.0 switch  # switch.py: switch
#                                             # times, engines' RAM and GPU memory, a CPU-tier
#                                             # hit after a switch, the front door's cost;
#                                             # arms sleep1 (the arena), sleep1-vllm (vLLM's
#                                             # own sleep backend), sleep2, stop
# Issue #43 (1b, 1c: switch rate against waiting, two people on two models):
#   ARMS=auto,turn0 benchmarks/gpu/release.sh 0.32.0 turns  # turns.py: per arm its own
#                                             # server, 60 s of load; auto (max_resident
#                                             # 'auto', 4 GiB pools: both resident), turnN
#                                             # (max_resident 1, min_resident_s N); TURNS_ARGS:
#                                             # more of its flags (--vllm-arg=--enforce-eager)
# Issue #21 (the LMCache arm; LMSITE: torch 2.13 + LMCache 0.5.6 from .gpu/lmcache, put
# ahead of SITE on PYTHONPATH):
#   LMSITE=/root/lmsite benchmarks/gpu/release.sh 0.32.0 lmcache  # bench baseline / native /
#                                             # lmcache: reuse, chat, sweep, memory
# Issue #46 (a vision-language model's vision tower offloaded; Qwen2.5-VL-7B shape, random
# weights written once to /root/ckpt-qwen2.5-vl-7b; Pillow/torchvision wheels from .gpu/vlm
# where the host lacks them):
#   benchmarks/gpu/release.sh 0.33.0 vlm      # vlm_parts.py: arms gpu / visual, both up
#                                             # at once, CUDA graphs (VLM_ARGS: more flags,
#                                             # e.g. --enforce-eager)
# Llama-3-8B shape, dummy weights, eager. H2D_GBPS (default: what the pinned case wrote
# beside SITE, else 55.4) is pinned_memory's registered H2D figure; DEADLINE (s, default
# 560) bounds the case so the call ends inside its limit.
# At most 8 files come back from $OUT: JSON, the servers' key lines, the logs as one .tar.xz.
set -uo pipefail
release=${1:-0.32.0}
case=${2:?pinned|tier|weights|weights-files|decode|kill9|reuse|layerwise|layerwise-graphs|hits|saturated|saturated-graphs|saturated-blocks|blocks|blocks-saturated|host-extension|lmcache|switch|vlm|turns}
site=${SITE:-/root/site}
vo=${VO:-/root/vo}  # the plugin's dist-info (as host_setup.sh writes it)
ckpts=${CHECKPOINTS:-/root}  # where random checkpoints are written, once per host
h2d_file=$(dirname "$site")/h2d-gbps.txt  # written by the pinned case on this host
h2d=${H2D_GBPS:-$([ -s "$h2d_file" ] && cat "$h2d_file" || echo 55.4)}
deadline=${DEADLINE:-560}
out=${OUT:-/tmp/out}
mkdir -p "$out"
src=$PWD/.gpu/src  # the committed package and scripts (git archive HEAD), when present
bench_dir=$([ -f "$src/benchmarks/server_memory.py" ] && echo "$src/benchmarks" || echo benchmarks)
export PYTHONPATH=${LMSITE:+$LMSITE:}$site:$([ -d "$src" ] && echo "$src:")$PWD
# `python3 -m` (and -c) put the working directory ahead of PYTHONPATH, so without this the
# checkout's vllm_offload, not .gpu/src's, ran the bench and its servers (#33's first call:
# "unrecognized arguments: --hit-concurrency"). The servers inherit it.
export PYTHONSAFEPATH=1
# torch 2.13 (LMSITE) was built against cuDNN 9.20, the host has 9.19; vLLM asks for cuDNN
# only on Blackwell, so the version check need not stop it.
[ -n "${LMSITE:-}" ] && export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
model=benchmarks/models/llama-3-8b
dummy=(--load-format dummy --skip-tokenizer-init --enforce-eager)
left() { echo $((deadline - SECONDS)); }
patch() { python3 -m vllm_offload patch "$1" --site "$site" 2>&1 | tail -2; }
# One server through server_memory.py; its own --timeout and SIGTERM stop fit the time left.
sm() {
  local wait=$(($(left) - 110))
  ((wait > 300)) && wait=300
  ((wait < 60)) && { echo "skip $2: $(left) s left"; return; }
  timeout -k 5 $((wait + 105)) python3 "$bench_dir/server_memory.py" --out "$out" \
    --timeout "$wait" "$@"
  leftovers
}
bench() {  # bench NAME ARGS...: `vllm-offload bench`, patched, 3 repeats, 4 GiB pools
  timeout -k 10 $(($(left) - 15)) python3 -m vllm_offload bench --model $model \
    --repeats 3 --pool-bytes $((4 << 30)) --gpu-memory-utilization 0.22 --token-ids \
    --h2d-gbps "$h2d" --tier-gib 16 --out "$out/$1" "${@:2}" -- "${dummy[@]}"
  leftovers
}
# Servers a timeout left behind (own sessions): vLLM's processes by title, serve launchers.
leftovers() {
  python3 - <<'EOF'
import os, psutil
mine = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
stray = []
for p in psutil.process_iter(["name", "cmdline"]):
    argv = p.info["cmdline"] or []
    if p.pid not in mine and ((p.info["name"] or "").startswith(("VLLM", "EngineCore"))
                              or argv[1:4] == ["-m", "vllm_offload", "serve"]):
        stray.append(p)
for p in stray:
    print("killing leftover", p.pid, p.info["name"])
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
psutil.wait_procs(stray, timeout=20)
EOF
}
# The several-models cases (switch, turns): the bundle's Python finds vllm_offload's vLLM
# plugin (AMX, the sleep arena) by its entry point, as an installed package's: give it one;
# the random Llama-3-8B-shaped checkpoint both models serve, made once per host.
fleet_setup() {
  local info=$vo/vllm_offload-0.1.0.dist-info
  mkdir -p $info
  printf 'Metadata-Version: 2.1\nName: vllm-offload\nVersion: 0.1.0\n' > $info/METADATA
  printf '[vllm.general_plugins]\nvllm_offload = vllm_offload.vllm_ext.plugin:register\n' \
    > $info/entry_points.txt
  export PYTHONPATH=$vo:$PYTHONPATH
  ckpt=$ckpts/ckpt-llama-3-8b-std0.02  # the std in the name: an older uniform one is not reused
  [ -f $ckpt/model.safetensors.index.json ] || \
    python3 benchmarks/gpu/random_checkpoint.py $model/config.json $ckpt --std 0.02
}
keylines() {  # the servers' key lines, then the whole logs as one archive
  local dir=$1
  grep -HE "KV cache size|GPU pool :|CPU tier|egistered|MADV_POPULATE|Created mmap|\
torch.zeros pinned|offloaded|Offloader|host arena|cudaHostRegister|host_register|host extension|\
init engine|Model loading took|Traceback|Error|error:" "$dir"/*.log 2>/dev/null \
    | grep -v "Tokenizer not available" | cut -c1-400 > "$dir/server-lines.txt"
  (cd "$dir" && ls ./*.log >/dev/null 2>&1 && tar -cJf logs.tar.xz ./*.log && rm -f ./*.log)
}
{ echo "release $release, $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv; free -g; df -h /dev/shm; ulimit -l; python3 -c 'import torch; print(torch.__version__)'
  python3 -m vllm_offload patch status --site "$site" 2>&1 | tail -3; } > "$out/host.txt" 2>&1
case $case in
pinned)
  timeout 200 python3 benchmarks/pinned_memory.py --out "$out/pinned_memory.json"
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); h2d = next(r['h2d_gbps'] \
for r in d['results'] if r['strategy'] == 'registered'); open(sys.argv[2], 'w').write(str(h2d))" \
    "$out/pinned_memory.json" "$h2d_file"
  echo "H2D (registered) $(cat "$h2d_file") GB/s"
  ;;
tier)
  # 0.32 logs the tier's populate/registration at DEBUG only; the prefix adds milliseconds.
  export VLLM_LOGGING_LEVEL=DEBUG VLLM_LOGGING_PREFIX='%(msecs)03d '
  patch apply
  sm --name s0-patched-none -- --model $model --kv-offload-backend none -- "${dummy[@]}"
  sm --name s1-patched-tier40 -- --model $model --kv-offload-backend native \
    --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
  patch revert
  sm --name s2-unpatched-tier40 -- --model $model --allow-unpatched \
    --kv-offload-backend native --kv-offload-cpu-tier-gib 40 -- "${dummy[@]}"
  keylines "$out"
  ;;
weights)
  patch apply
  sm --name s3-patched-w8 -- --model $model --kv-offload-backend none \
    --weights-offload-cpu-gib 8 -- "${dummy[@]}"
  patch revert
  sm --name s4-unpatched-w8 -- --model $model --allow-unpatched --kv-offload-backend none \
    --weights-offload-cpu-gib 8 -- "${dummy[@]}"
  patch apply
  sm --name s5-patched-pf8 -- --model $model --kv-offload-backend none \
    --weights-offload-cpu-gib 8 --weights-offload-backend prefetch -- "${dummy[@]}"
  patch revert
  sm --name s6-unpatched-pf8 -- --model $model --allow-unpatched --kv-offload-backend none \
    --weights-offload-cpu-gib 8 --weights-offload-backend prefetch -- "${dummy[@]}"
  keylines "$out"
  ;;
weights-files)
  # The weights case's start times with real weight files: dummy weights fill CPU-resident
  # (prefetch-offloaded) parameters with the CPU's random generator, which UVA's GPU views
  # never pay. Random bf16 safetensors, read warm from the page cache by every arm.
  ckpt=$ckpts/ckpt-llama-3-8b-std0.02  # the std in the name: an older uniform one is not reused
  [ -f $ckpt/model.safetensors.index.json ] || \
    python3 benchmarks/gpu/random_checkpoint.py $model/config.json $ckpt --std 0.02
  files=(--skip-tokenizer-init --enforce-eager)
  for round in 1 2; do  # interleaved: the first server after boot pays one-off costs
    patch apply
    sm --name f5-patched-pf8-$round -- --model $ckpt --kv-offload-backend none \
      --weights-offload-cpu-gib 8 --weights-offload-backend prefetch -- "${files[@]}"
    sm --name f3-patched-w8-$round -- --model $ckpt --kv-offload-backend none \
      --weights-offload-cpu-gib 8 -- "${files[@]}"
    patch revert
    sm --name f6-unpatched-pf8-$round -- --model $ckpt --allow-unpatched \
      --kv-offload-backend none --weights-offload-cpu-gib 8 --weights-offload-backend prefetch \
      -- "${files[@]}"
  done
  python3 -c 'import json, sys; [print(json.dumps(json.load(open(f)))) for f in sys.argv[1:]]' \
    "$out"/f*.json > "$out/weights-files.jsonl" && rm "$out"/f*.json
  keylines "$out"
  ;;
decode)
  patch apply
  bench decode --arms baseline --arm "uva8=baseline --weights-offload-cpu-gib 8" \
    --arm "pf8=baseline --weights-offload-cpu-gib 8 --weights-offload-backend prefetch" \
    --workloads decode,memory --decode-batch 16 --prompt-tokens 128 --output-tokens 64
  ;;
kill9)
  patch apply
  timeout -k 10 $(($(left) / 2)) python3 benchmarks/gpu/kill9.py --name patched --out "$out"
  leftovers
  patch revert
  timeout -k 10 $(($(left) - 15)) python3 benchmarks/gpu/kill9.py --name unpatched \
    --out "$out" --serve-flag=--allow-unpatched
  leftovers
  keylines "$out"
  ;;
reuse)
  # Today's defaults: 128-token GPU blocks, 256-token CPU chunks (no block/chunk flags).
  patch apply
  bench reuse --arms baseline,native --workloads reuse,sweep,memory --docs 8 \
    --doc-tokens 8000 --settle-seconds 0.5 --rates max --max-concurrency 48 \
    --rate-seconds 7 --prompt-tokens 512 --output-tokens 64
  ;;
layerwise)
  patch apply
  timeout -k 10 $(($(left) - 15)) python3 benchmarks/gpu/layerwise_check.py --out "$out/check"
  leftovers
  ;;
layerwise-graphs)  # CUDA graphs on: a one-token CPU hit beside a decode runs as a full graph
  patch apply
  timeout -k 10 $(($(left) - 15)) python3 benchmarks/gpu/layerwise_check.py --out "$out/check" \
    --cuda-graphs --doc-tokens 7936 --tail-tokens 1 --decoy-tokens 400
  leftovers
  ;;
hits)
  patch apply
  bench hits --repeats 5 --arms baseline,native --arm 'async=native --kv-offload-layerwise-loads false' \
    --workloads reuse,memory --docs 8 --doc-tokens 8000 --settle-seconds 0.5
  ;;
saturated)
  patch apply
  bench saturated --repeats 8 --arms baseline,native --workloads sweep --rates max \
    --max-concurrency 48 --rate-seconds 20 --prompt-tokens 512 --output-tokens 64
  ;;
saturated-graphs)
  patch apply
  dummy=(--load-format dummy --skip-tokenizer-init)
  bench saturated --repeats "${REPEATS:-20}" --arms baseline,native --workloads sweep \
    --rates max --max-concurrency 48 --rate-seconds 8 --prompt-tokens 512 --output-tokens 64
  ;;
saturated-blocks)  # is native's TTFT at saturation its tier or its 128-token blocks?
  patch apply
  dummy=(--load-format dummy --skip-tokenizer-init)
  bench saturated --repeats "${REPEATS:-14}" --arms baseline,native \
    --arm 'b128=baseline --kv-offload-block-size 128' --workloads sweep \
    --rates max --max-concurrency 48 --rate-seconds 8 --prompt-tokens 512 --output-tokens 64
  ;;
blocks)  # issue #33: do 16-token GPU blocks under 256-token chunks load as fast as 128?
  patch apply
  timeout -k 5 150 python3 "$bench_dir/gpu/swap_blocks.py" --out "$out/swap_blocks.json"
  # the floor's link: the same call's 1 GiB in 64 MiB descriptors (registered host memory)
  h2d=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["link_16x64MiB"]["gbps"])' \
    "$out/swap_blocks.json" 2>/dev/null || echo "$h2d")
  echo "H2D for the floor: $h2d GB/s"
  dummy=(--load-format dummy --skip-tokenizer-init)
  arm() { echo "b$1c$2=native --kv-offload-block-size $1 --kv-offload-cpu-chunk-tokens $2"; }
  bench blocks --repeats "${REPEATS:-3}" --arms baseline --arm "$(arm 128 256)" \
    --arm "$(arm 16 256)" --arm "$(arm 32 256)" --workloads reuse,memory --docs 11 \
    --doc-tokens 8000 --settle-seconds 0.3 --hit-concurrency 1,8 --pool-bytes $((8 << 30))
  ;;
blocks-saturated)  # issue #33: the same arms' cost at 0 % reuse, saturated
  patch apply
  dummy=(--load-format dummy --skip-tokenizer-init)
  arm() { echo "b$1c$2=native --kv-offload-block-size $1 --kv-offload-cpu-chunk-tokens $2"; }
  bench saturated --repeats "${REPEATS:-14}" --arms baseline --arm "$(arm 128 256)" \
    --arm "$(arm 16 256)" --workloads sweep --rates max --max-concurrency 48 \
    --rate-seconds 8 --prompt-tokens 512 --output-tokens 64
  ;;
host-extension)
  patch apply
  weights=()
  if [ -n "${RANDOM_WEIGHTS_STD:-}" ]; then  # a context-sensitive random checkpoint
    python3 benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3.1-8b/config.json \
      "$ckpts/ckpt-std" --std "$RANDOM_WEIGHTS_STD" && weights=(--weights "$ckpts/ckpt-std")
  fi
  timeout -k 10 $(($(left) - 15)) python3 benchmarks/gpu/host_extension.py --out "$out/host-extension" \
    "${weights[@]}" ${HOST_EXTENSION_ARGS:-}
  leftovers
  ;;
lmcache)
  patch apply
  python3 -c 'import torch, lmcache, lmcache.cuda_ops; print("torch", torch.__version__, "lmcache", lmcache.__version__ if hasattr(lmcache, "__version__") else "?")'
  bench lmcache --arms baseline,native,lmcache --workloads reuse,chat,sweep,memory --docs 8 \
    --doc-tokens 8000 --settle-seconds 0.5 --conversations 4 --turns 4 --rates max \
    --max-concurrency 48 --rate-seconds 15 --prompt-tokens 512 --output-tokens 64
  ;;
switch)  # issue #31: two models through the front door (switch.py), ARMS in this call
  patch apply
  fleet_setup
  for arm in ${ARMS:-sleep1}; do
    case $arm in
    sleep1) flags=(--idle sleep --level 1 --front-windows "${WINDOWS:-2}") ;;
    sleep1-vllm) flags=(--idle sleep --level 1 --arena 0) ;;  # vLLM's own sleep backend
    sleep2) flags=(--idle sleep --level 2) ;;
    stop) flags=(--idle stop --switches "${STOP_SWITCHES:-2}") ;;
    *) echo "unknown arm $arm" >&2; continue ;;
    esac
    timeout -k 10 $(($(left) - 20)) python3 "$bench_dir/gpu/switch.py" --checkpoint $ckpt \
      --out "$out/switch-$arm.json" "${flags[@]}"
    leftovers
  done
  (cd "$out" && tar -cJf switch-logs.tar.xz ./*.log && rm -f ./*.log)
  ;;
vlm)
  patch apply
  # shellcheck disable=SC2086  # VLM_ARGS: several flags
  timeout -k 10 $(($(left) - 15)) python3 "$bench_dir/gpu/vlm_parts.py" --out "$out/vlm" \
    --checkpoint "$ckpts/ckpt-qwen2.5-vl-7b" ${VLM_ARGS:-}
  leftovers
  ;;
turns)  # issue #43: switch rate against waiting (turns.py), ARMS (comma-separated) in this call
  patch apply
  fleet_setup
  arms=${ARMS:-auto,turn0}
  # shellcheck disable=SC2086  # TURNS_ARGS: several flags
  timeout -k 10 $(($(left) - 20)) python3 "$bench_dir/gpu/turns.py" --checkpoint $ckpt \
    --out "$out" --arms "${arms// /,}" --budget-s $(($(left) - 40)) ${TURNS_ARGS:-}
  leftovers
  (cd "$out" && tar -cJf turns-logs.tar.xz ./*.log && rm -f ./*.log)
  ;;
*) echo "unknown case $case" >&2; exit 2 ;;
esac
for dir in "$out/decode" "$out/reuse" "$out/hits" "$out/saturated" "$out/check" "$out/lmcache" \
  "$out/host-extension" "$out/blocks" "$out/vlm"; do
  [ -d "$dir" ] || continue
  [ -f "$dir/results.json" ] && rm -f "$dir/results.partial.json"
  rm -f "$dir"/summary.csv "$dir"/*.png
  keylines "$dir"
done
find "$out" -type f | sort | xargs ls -la
