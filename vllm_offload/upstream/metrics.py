"""The vLLM Prometheus metrics vllm-offload reads (vLLM 0.32), each named once: the manager's
charts, its wedge watch and CPU-tier card, and the bench take their names from here.
Counters are exported with ``_total`` (``vllm_client.sum_samples`` drops it), histograms
as ``_sum`` / ``_count``."""

from __future__ import annotations

# Gauges
RUNNING = "vllm:num_requests_running"  # requests in the batch
WAITING = "vllm:num_requests_waiting"  # queued
GPU_KV_USAGE = "vllm:kv_cache_usage_perc"  # fraction of the GPU pool's blocks in use
# Fraction of the CPU tier pinned by transfers in flight (not how full it is).
CPU_TIER_BUSY = "vllm:kv_offload_cpu_cache_usage_perc"
KV_LOADS_BY_STAGE = "vllm:num_requests_kv_fetch_by_stage"  # requests in an async KV load

# Counters
PROMPT_TOKENS = "vllm:prompt_tokens"  # counted when a prompt's prefill completes
GENERATION_TOKENS = "vllm:generation_tokens"
GPU_PREFIX_HITS = "vllm:prefix_cache_hits"  # prompt tokens found in the GPU pool
CPU_TIER_HITS = "vllm:external_prefix_cache_hits"  # prompt tokens loaded by the connector
PREEMPTIONS = "vllm:num_preemptions"
OFFLOAD_LOAD_BYTES = "vllm:kv_offload_load_bytes"  # CPU tier -> GPU
OFFLOAD_LOAD_TIME = "vllm:kv_offload_load_time"
OFFLOAD_STORE_BYTES = "vllm:kv_offload_store_bytes"  # GPU -> CPU tier
OFFLOAD_STORE_TIME = "vllm:kv_offload_store_time"
# vLLM 0.32's tiering: only secondary tiers (the disk tier) export these.
DISK_READ_BYTES = "vllm:kv_offload_tiering_read_bytes"
DISK_READ_TIME = "vllm:kv_offload_tiering_read_time"
DISK_WRITE_BYTES = "vllm:kv_offload_tiering_write_bytes"
DISK_WRITE_TIME = "vllm:kv_offload_tiering_write_time"

# Histograms (read as their _sum and _count)
TTFT = "vllm:time_to_first_token_seconds"
QUEUE_TIME = "vllm:request_queue_time_seconds"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
