#!/usr/bin/env python3
"""The seed fork's entry point, kept as a thin shim: `vllm-offload serve` with the same
arguments (e.g. `tools/vllm_cpu_offload_server.py --config /etc/vllm-offload/config.toml`)."""

import sys

from vllm_offload.cli import main

if __name__ == "__main__":
    sys.exit(main(["serve", *sys.argv[1:]]))
