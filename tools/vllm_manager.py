#!/usr/bin/env python3
"""The seed's manager entry point, kept as a thin shim over `vllm-offload manager`."""

import sys

from vllm_offload.compat import seed_entry_point

if __name__ == "__main__":
    sys.exit(seed_entry_point("manager"))
