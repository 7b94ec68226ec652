"""What vLLM loads from vllm-offload through its own extension points (a general plugin,
the disk tier and the CPU tier's connector by module path, a sleep-mode backend): code
that runs inside vLLM's processes, instead of hunks in vLLM's files."""

# With it set to 1 (the launcher does for engines that sleep), the plugin makes
# vllm_ext.sleep's backend the one vLLM's sleep mode uses.
SLEEP_ARENA_ENV = "VLLM_OFFLOAD_SLEEP_ARENA"
