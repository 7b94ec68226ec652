#!/usr/bin/env bash
# Issue #43 on a GPU host: does the front door see our sleep backend's line and sleep (not
# stop) an engine, and does a model answer the same after a level-1 sleep and wake (the
# arena's correctness: dummy random weights, the same prompt's tokens and logprobs before
# and after, and a control prompt that must differ)? Two tiny Llama-shaped models through
# `vllm-offload serve`, max_resident 1, eager. Needs vLLM (PYTHONPATH) and our plugin's
# dist-info on the path (as benchmarks/gpu/release.sh writes it). Writes $OUT/fleet-sleep/.
set -u
out=${OUT:-/tmp/out}/fleet-sleep; mkdir -p "$out"; work=/tmp/fleet-sleep; rm -rf "$work"
for m in a b; do
  mkdir -p "$work/$m"
  cat > "$work/$m/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
 "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
 "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096,
 "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "torch_dtype": "bfloat16",
 "tie_word_embeddings": false}
JSON
done
cat > "$work/config.toml" <<EOF2
extra_args = ["--load-format=dummy", "--skip-tokenizer-init", "--enforce-eager"]
[gpu]
kv_cache_memory_bytes = 1073741824
[kv_offload]
backend = "none"
[server]
port = 8310
[[models]]
path = "$work/a"
served_name = "a"
[[models]]
path = "$work/b"
served_name = "b"
[residency]
max_resident = 1
idle = "sleep"
sleep_level = 1
min_resident_s = 0.0
runtime_dir = "$work/run"
EOF2
url=http://127.0.0.1:8310
setsid python3 -m vllm_offload serve --config "$work/config.toml" > "$out/serve.log" 2>&1 &
pid=$!; t0=$SECONDS; ok=0
for _ in $(seq 1 180); do sleep 2; curl -sf $url/health >/dev/null && { ok=1; break; }; done
echo "healthy=$ok after $((SECONDS - t0)) s" | tee "$out/result.txt"
ask() {  # ask MODEL PROMPT_IDS: greedy tokens and logprobs of 16 tokens
  curl -s $url/v1/completions -H 'Content-Type: application/json' -d "{\"model\": \"$1\",
    \"prompt\": $2, \"max_tokens\": 16, \"min_tokens\": 16, \"ignore_eos\": true,
    \"temperature\": 0, \"logprobs\": 1, \"return_tokens_as_token_ids\": true}" \
    | python3 -c 'import json, sys
raw = sys.stdin.read()
try:  # the first run (2026-11-25) got no "choices": the answer is printed whole now
    c = json.loads(raw)["choices"][0]["logprobs"]
    print(json.dumps({"tokens": c["tokens"], "logprobs": c["token_logprobs"]}))
except (ValueError, KeyError, IndexError, TypeError):
    print(json.dumps({"tokens": None, "logprobs": [], "answer": raw[:2000]}))'
}
p1='[11, 2345, 678, 9012, 345, 6789, 1234, 567, 8901, 23]'
p2='[11, 2345, 678, 9012, 345, 6789, 1234, 567, 8901, 24]'
before=$(ask a "$p1"); echo "a before: $before" >> "$out/result.txt"
echo "b: $(ask b "$p1")" >> "$out/result.txt"
after=$(ask a "$p1"); echo "a after: $after" >> "$out/result.txt"
control=$(ask a "$p2"); echo "a control: $control" >> "$out/result.txt"
python3 - "$before" "$after" "$control" >> "$out/result.txt" <<'PY'
import json, sys
b, a, c = (json.loads(x) for x in sys.argv[1:4])
diffs = [abs(x - y) for x, y in zip(b["logprobs"], a["logprobs"])]
print("same tokens after sleep/wake:", b["tokens"] is not None and b["tokens"] == a["tokens"],
      "max logprob diff:", max(diffs, default=None))
print("control differs:", c["tokens"] != b["tokens"])
PY
curl -s $url/v1/models >> "$out/result.txt"; echo >> "$out/result.txt"
{ echo "== marker lines"; grep -c "sleep backend: vllm_offload" "$out/serve.log"
  echo "== switches"; grep -E "slept|stopped|woke|started|sleep backend|refus|Traceback|Error" \
    "$out/serve.log" | grep -v "^\[.\] *$" | cut -c1-300 | head -40; } >> "$out/result.txt"
kill -TERM -- -$pid 2>/dev/null; for _ in $(seq 1 40); do kill -0 $pid 2>/dev/null || break; sleep 1; done
kill -9 -- -$pid 2>/dev/null; cat "$out/result.txt"
