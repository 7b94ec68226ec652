#!/usr/bin/env python3
"""Issue #43 (5): where a level-1 wake's time goes, and the sleep arena's wake before and
after it maps and copies in one pass. One process, no server: vLLM's CuMemAllocator holds
a Llama-3-8B-shaped set of weights (the checkpoint's config; random, std 0.02, bf16, one
tensor per parameter as vLLM loads them), an 8 GiB KV cache (a tensor per layer) and a
CUDA-graph-sized pool (--graphs-gib), tagged as vLLM tags them. Arms, interleaved round by
round (the order turned each round), each with its own arena:

  serial     the arena's wake as it was (vLLM's ``wake_up`` maps every allocation, after a
             gc.collect, then one synchronous copy per allocation)
  pipelined  vllm_ext/sleep.py's: each allocation's copy starts as soon as it is mapped

Each round: each arm's level-1 sleep (after the first, the weights' copy is kept) and its
wake, timed to the device's idle; after each wake the weights equal a reference copy
(bitwise, torch.equal) and the graph pool its bytes before the sleep. Then the map alone
(vLLM's sleep keeping nothing and its ``wake_up``), after which the weights are zeroed, so
the next wake must bring them back from its arena. A control changes one weight element
and shows the check fails. The floor: the weights' bytes in one cudaMemcpy from a
registered host buffer, in the same process. Writes --out (JSON) and prints medians with
min-max.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from vllm.device_allocator.cumem import CuMemAllocator, libcudart

from vllm_offload.vllm_ext.sleep import ArenaBackend, HostArena

GIB = 1 << 30


class SerialBackend(ArenaBackend):
    """The arena's wake before #43 (5): vLLM maps everything, then the copies, one by one."""

    def resume(self, tags: list[str] | None = None) -> None:
        allocator = CuMemAllocator.get_instance()
        allocator.wake_up(tags)
        waiting = []
        for saved in self._saved:
            if self._arena is not None and not allocator.pointer_to_data[saved.ptr].is_asleep:
                libcudart.cudaMemcpy(saved.ptr, self._arena.ptr + saved.offset, saved.size)
            else:
                waiting.append(saved)
        self._saved = waiting


def shapes(config: dict[str, Any]) -> list[tuple[int, ...]]:
    """A Llama's parameters as vLLM holds them (qkv and gate/up merged)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    layer = [
        ((heads + 2 * kv_heads) * head_dim, hidden),
        (hidden, heads * head_dim),
        (2 * inter, hidden),
        (hidden, inter),
        (hidden,),
        (hidden,),
    ]
    vocab: int = config["vocab_size"]
    return [(vocab, hidden), *layer * config["num_hidden_layers"], (hidden,), (vocab, hidden)]


def timed(step: Any) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - began


def floor_s(nbytes: int, repeats: int) -> list[float]:
    """The weights' bytes in one copy from a registered host buffer to one GPU buffer."""
    host = HostArena(nbytes)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    try:
        return [
            timed(lambda: libcudart.cudaMemcpy(device.data_ptr(), host.ptr, nbytes))
            for _ in range(repeats)
        ]
    finally:
        host.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="a model's config.json")
    parser.add_argument("--kv-gib", type=float, default=8.0)
    parser.add_argument("--graphs-gib", type=float, default=0.67)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = json.loads(args.config.read_text())
    torch.manual_seed(0)
    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        weights = [
            torch.randn(s, dtype=torch.bfloat16, device="cuda") * 0.02 for s in shapes(config)
        ]
    layers = config["num_hidden_layers"]
    with allocator.use_memory_pool(tag="kv_cache"):
        kv_cache = [  # held: freed tensors would leave the pool
            torch.empty(int(args.kv_gib * GIB) // layers, dtype=torch.uint8, device="cuda")
            for _ in range(layers)
        ]
    with allocator.use_memory_pool(tag="cudagraph"):
        graphs = torch.randint(
            0, 255, (int(args.graphs_gib * GIB),), dtype=torch.uint8, device="cuda"
        )
    reference = [w.clone() for w in weights]  # outside the pool: never slept
    graphs_before = graphs.clone()
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)

    def same() -> bool:
        return torch.equal(graphs, graphs_before) and all(
            torch.equal(w, r) for w, r in zip(weights, reference, strict=True)
        )

    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "weights_gib": round(weight_bytes / GIB, 3),
        "weight_tensors": len(weights),
        "allocations": {
            tag: sum(1 for d in allocator.pointer_to_data.values() if d.tag == tag)
            for tag in ("weights", "kv_cache", "cudagraph")
        },
        "kv_gib": args.kv_gib,
        "kv_tensors": len(kv_cache),
        "graphs_gib": args.graphs_gib,
        "floor_s": floor_s(weight_bytes, 3),
    }
    backends = {"serial": SerialBackend(), "pipelined": ArenaBackend()}
    arms: dict[str, dict[str, list[Any]]] = {
        name: {"wake_s": [], "sleep_s": [], "same": []} for name in backends
    }
    map_s = []
    for round_ in range(args.rounds):
        order = list(backends) if round_ % 2 == 0 else list(reversed(backends))
        for name in order:
            backend = backends[name]
            arms[name]["sleep_s"].append(timed(lambda b=backend: b.suspend(level=1)))
            arms[name]["wake_s"].append(timed(lambda b=backend: b.resume(None)))
            arms[name]["same"].append(same())
        allocator.sleep(offload_tags=())  # the map alone: everything released, nothing kept
        map_s.append(timed(lambda: allocator.wake_up(None)))
        for w in weights:  # the next wake must bring them back: the arenas keep their copy
            w.zero_()
        graphs.copy_(graphs_before)  # copied out at every sleep
    backends["pipelined"].suspend(level=1)  # once more, for the control on woken weights
    backends["pipelined"].resume(None)
    result["before_control_same"] = same()
    weights[7].view(-1)[123] += 1  # the control: one element changed
    result["control_detected"] = not same()
    weights[7].copy_(reference[7])
    result["after_control_same"] = same()
    result["arms"] = arms
    result["map_alone_s"] = map_s
    args.out.write_text(json.dumps(result, indent=1))
    for name, arm in arms.items():
        print(
            f"{name:<10} wake {_mm(arm['wake_s'])}  sleep {_mm(arm['sleep_s'])}  "
            f"same {all(arm['same'])}"
        )
    print(f"the map alone (vLLM's wake_up, nothing to copy) {_mm(map_s)}")
    print(f"floor: {weight_bytes / GIB:.2f} GiB in one copy {_mm(result['floor_s'])}")
    print(
        f"control: same before {result['before_control_same']}, detected "
        f"{result['control_detected']}, same after it is undone {result['after_control_same']}"
    )
    control = result["before_control_same"] and result["control_detected"]
    return 0 if all(all(a["same"]) for a in arms.values()) and control else 1


def _mm(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"


if __name__ == "__main__":
    sys.exit(main())
