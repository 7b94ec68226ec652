"""What vLLM loads from vllm-offload through its own extension points (a general plugin,
the disk tier and the CPU tier's connector by module path, a sleep-mode backend), and the
logic the patch series calls from vLLM's files (kv_capacity, host_pinning,
kv_host_extension, kv_host_mapping): code that runs inside vLLM's processes, linted,
typed and tested here instead of living in the diffs. knobs.py names every setting they
read; it alone imports no vLLM, so the launcher can."""
