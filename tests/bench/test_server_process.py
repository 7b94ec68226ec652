"""The server-log scanner, on lines the GPU runs logged (benchmarks/results/)."""

from __future__ import annotations

from vllm_offload.bench.server_process import scan_log

# vLLM 0.25.0 on the H200, patched: UVA weight offload, the CPU KV tier, the prefetch backend.
UVA = """\
(EngineCore pid=3114) INFO 11-22 02:52:18 [uva.py:62] Total CPU offloaded parameters: 8.02
(EngineCore pid=3114) INFO 11-22 02:52:18 [uva.py:67] Offloaded weights in a registered \
host arena: 8.02 (exact size)
(EngineCore pid=3114) INFO 11-22 02:52:27 [kv_cache_utils.py:2151] GPU KV cache size: \
32,768 tokens
"""
TIER = """\
(EngineCore pid=974) INFO 11-22 02:45:04 [host_pinning.py:143] Registered the CPU KV tier: \
0.50 GiB pageable in 1 chunks (cudaHostRegister) in 0.21 s
(EngineCore pid=974) INFO 11-22 02:45:04 [host_pinning.py:143] Registered the CPU KV tier: \
0.50 GiB pageable in 1 chunks (cudaHostRegister) in 0.22 s
"""
PREFETCH = """\
(EngineCore pid=3067) INFO 11-22 02:55:09 [prefetch.py:355] [PrefetchOffloader] Initialized \
20 modules. Total GPU memory saved: 8.7245 GB, Static buffer pool: 0.4362 GB (group_size=6, \
num_in_group=4, prefetch_step=1, mode=cpu)
"""


def test_scan_log_reads_what_the_gpu_runs_logged() -> None:
    uva = scan_log(UVA)
    assert (uva["offloaded_gib"], uva["arena_gib"], uva["kv_cache_tokens"]) == (8.02, 8.02, 32768)
    assert uva["prefetch_offloaded_gb"] is None and uva["tier_registered_s"] is None
    assert scan_log(TIER)["tier_registered_s"] == 0.43
    prefetch = scan_log(PREFETCH)
    assert prefetch["prefetch_offloaded_gb"] == 8.7245 and prefetch["arena_gib"] is None
