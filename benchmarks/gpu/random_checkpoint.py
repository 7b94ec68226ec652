#!/usr/bin/env python3
"""Write a Llama-shaped safetensors checkpoint of random bf16 weights beside a copy of
CONFIG (issue #16: dummy weights start prefetch offload unfairly slowly, because vLLM's
dummy loader fills CPU-resident parameters with the CPU's random generator; real files
load the same way for every arm). Random values come from the GPU; the files land in the
page cache, so every arm reads them warm.

    benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3-8b/config.json /root/ckpt

A Qwen2.5-VL config (model_type qwen2_5_vl, issue #46) gets the vision tower and its patch
merger too (``visual.*``, as the original checkpoints name them; vLLM's hf_to_vllm_mapper
maps ``model.`` to ``language_model.model.``) and Qwen2's q/k/v biases. --device cpu writes
one without a GPU (the CPU dry run of benchmarks/gpu/vlm_parts.py).

--std S draws matrices from a normal of that deviation and sets the norms to 1 instead
(issue #22): vLLM's dummy values (+-1e-3) make attention near uniform, so the output does
not move when one token of a long prompt changes; at 0.02 it does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from kit.checkpoint import write_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shard-gib", type=float, default=4)
    parser.add_argument("--std", type=float, help="normal matrices, norms 1 (default: +-1e-3)")
    parser.add_argument("--device", default="cuda", help="where the random values are drawn")
    parser.add_argument("--seed", type=int, default=0, help="torch's seed for the values")
    args = parser.parse_args()
    write_checkpoint(
        args.config,
        args.out,
        std=args.std,
        shard_gib=args.shard_gib,
        device=args.device,
        seed=args.seed,
    )


if __name__ == "__main__":
    main()
