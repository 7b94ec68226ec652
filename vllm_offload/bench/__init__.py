"""`vllm-offload bench`: baseline vs CPU KV tier (vs LMCache), measured the same way."""
