#!/usr/bin/env python3
"""Write a Llama-shaped safetensors checkpoint of random bf16 weights beside a copy of
CONFIG (issue #16: dummy weights start prefetch offload unfairly slowly, because vLLM's
dummy loader fills CPU-resident parameters with the CPU's random generator; real files
load the same way for every arm). Random values come from the GPU; the files land in the
page cache, so every arm reads them warm.

    benchmarks/gpu/random_checkpoint.py benchmarks/models/llama-3-8b/config.json /root/ckpt

--std S draws matrices from a normal of that deviation and sets the norms to 1 instead
(issue #22): vLLM's dummy values (+-1e-3) make attention near uniform, so the output does
not move when one token of a long prompt changes; at 0.02 it does.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file


def shapes(config: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    vocab = config["vocab_size"]
    out = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        }
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = (vocab, hidden)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--shard-gib", type=float, default=4)
    parser.add_argument("--std", type=float, help="normal matrices, norms 1 (default: +-1e-3)")
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.config, args.out / "config.json")
    shard: dict[str, torch.Tensor] = {}
    index: dict[str, str] = {}
    files = 0

    def flush() -> None:
        nonlocal shard, files
        name = f"model-{files:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, args.out / name)
        index.update({k: name for k in shard})
        shard, files = {}, files + 1

    for name, shape in shapes(config).items():
        if args.std is None:
            shard[name] = (torch.rand(shape, device="cuda", dtype=torch.bfloat16) - 0.5) * 2e-3
        elif name.endswith("norm.weight"):
            shard[name] = torch.ones(shape, device="cuda", dtype=torch.bfloat16)
        else:
            shard[name] = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * args.std
        if sum(t.numel() * 2 for t in shard.values()) >= args.shard_gib * (1 << 30):
            flush()
    if shard:
        flush()
    (args.out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}, indent=1)
    )
    print(f"{len(index)} tensors in {files} files under {args.out}")


if __name__ == "__main__":
    main()
