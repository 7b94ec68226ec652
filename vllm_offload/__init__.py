"""vllm-offload: an offload-aware vLLM distribution for one-GPU servers."""

__version__ = "0.1.0"
