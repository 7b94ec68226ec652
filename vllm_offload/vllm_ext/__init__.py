"""What vLLM loads from vllm-offload through its own extension points (a general plugin,
the disk tier by module path): code that runs inside vLLM's processes, instead of hunks in
vLLM's files."""
