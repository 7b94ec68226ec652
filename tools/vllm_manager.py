#!/usr/bin/env python3
"""The seed's manager entry point, kept as a thin shim over `vllm-offload manager`."""

import sys

from vllm_offload.cli import main

if __name__ == "__main__":
    sys.exit(main(["manager", *sys.argv[1:]]))
