"""A random safetensors checkpoint of a config.json's shape (Llama-shaped decoders; a
Qwen2.5-VL config's vision tower and patch merger too, with Qwen2's q/k/v biases), drawn on
``device`` in bf16: normal matrices of deviation ``std`` with norms 1, or vLLM's dummy
+-1e-3 where ``std`` is None. random_checkpoint.py is its command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file


def shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    if config.get("model_type") == "qwen2_5_vl":
        return qwen25_vl_shapes(config)
    return decoder_shapes(config)


def decoder_shapes(config: dict[str, Any], qkv_bias: bool = False) -> dict[str, tuple[int, ...]]:
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
        if qkv_bias:
            out |= {
                p + "self_attn.q_proj.bias": (heads * head_dim,),
                p + "self_attn.k_proj.bias": (kv_heads * head_dim,),
                p + "self_attn.v_proj.bias": (kv_heads * head_dim,),
            }
    if not config.get("tie_word_embeddings"):
        out["lm_head.weight"] = (vocab, hidden)
    return out


def qwen25_vl_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Qwen2.5-VL: the vision transformer (a 3-D patch embedding, blocks with a fused qkv
    and a gated MLP, all with biases), the patch merger, then Qwen2's language model."""
    vc = config["vision_config"]
    h, inter, out_hidden = vc["hidden_size"], vc["intermediate_size"], vc["out_hidden_size"]
    patch, temporal = vc.get("patch_size", 14), vc.get("temporal_patch_size", 2)
    merged = h * vc.get("spatial_merge_size", 2) ** 2
    channels = vc.get("in_channels", vc.get("in_chans", 3))
    out: dict[str, tuple[int, ...]] = {
        "visual.patch_embed.proj.weight": (h, channels, temporal, patch, patch)
    }
    for i in range(vc["depth"]):
        p = f"visual.blocks.{i}."
        out |= {
            p + "norm1.weight": (h,),
            p + "norm2.weight": (h,),
            p + "attn.qkv.weight": (3 * h, h),
            p + "attn.qkv.bias": (3 * h,),
            p + "attn.proj.weight": (h, h),
            p + "attn.proj.bias": (h,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.gate_proj.bias": (inter,),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.up_proj.bias": (inter,),
            p + "mlp.down_proj.weight": (h, inter),
            p + "mlp.down_proj.bias": (h,),
        }
    out |= {
        "visual.merger.ln_q.weight": (h,),
        "visual.merger.mlp.0.weight": (merged, merged),
        "visual.merger.mlp.0.bias": (merged,),
        "visual.merger.mlp.2.weight": (out_hidden, merged),
        "visual.merger.mlp.2.bias": (out_hidden,),
    }
    return out | decoder_shapes(config, qkv_bias=True)


def write_checkpoint(
    config_path: Path,
    out: Path,
    *,
    std: float | None,
    shard_gib: float = 4,
    device: str = "cuda",
    seed: int = 0,
) -> int:
    """The random checkpoint of ``config_path`` under ``out``; how many tensors. Seeded:
    the same files on every machine of one kind of GPU and torch, so that answers recorded
    on one machine are a reference on the next."""
    config = json.loads(config_path.read_text())
    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    if config_path.resolve() != (out / "config.json").resolve():
        shutil.copy(config_path, out / "config.json")
    shard: dict[str, torch.Tensor] = {}
    index: dict[str, str] = {}
    files = 0

    def flush() -> None:
        nonlocal shard, files
        name = f"model-{files:05d}.safetensors"
        save_file({k: v.cpu() for k, v in shard.items()}, out / name)
        index.update({k: name for k in shard})
        shard, files = {}, files + 1

    for name, shape in shapes(config).items():
        if std is None:
            shard[name] = (torch.rand(shape, device=device, dtype=torch.bfloat16) - 0.5) * 2e-3
        elif name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")):
            shard[name] = torch.ones(shape, device=device, dtype=torch.bfloat16)
        else:
            shard[name] = torch.randn(shape, device=device, dtype=torch.bfloat16) * std
        if sum(t.numel() * 2 for t in shard.values()) >= shard_gib * (1 << 30):
            flush()
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}, indent=1)
    )
    print(f"{len(index)} tensors in {files} files under {out}")
    return len(index)
