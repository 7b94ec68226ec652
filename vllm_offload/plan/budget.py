"""One GPU's memory before the KV pool: what vLLM may use (gpu.memory_utilization of the
smallest card), its working memory at the planned prefill chunk, the weights at the dtype
vLLM serves them, and what of them can be offloaded (whole decoder layers, bounded by
host RAM)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from vllm_offload.config import DeploymentConfig
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.host import weights_room_bytes
from vllm_offload.plan.kv import compute_dtype_bytes
from vllm_offload.plan.records import PlanError, PlanInputs
from vllm_offload.plan.working_memory import gpu_overhead_bytes, prefill_chunk


@dataclass(frozen=True, kw_only=True)
class GpuBudget:
    """One rank's GPU memory before the KV pool: what vLLM may use, its working memory,
    and the weights (whole decoder layers are what can be offloaded)."""

    total_bytes: int
    budget_bytes: int
    overhead_bytes: int  # without the prefetch backend's layer buffers
    weights_bytes: int
    layer_bytes: int
    layers: int  # decoder layers on this rank
    prefetch_buffer_bytes: int  # the prefetch backend's GPU buffers, when it offloads
    ram_room_bytes: int  # the most offloaded weights host RAM holds for this rank

    @property
    def offloadable_bytes(self) -> int:
        return min(self.weights_bytes, self.layer_bytes * self.layers, self.ram_room_bytes)

    @property
    def ram_bound(self) -> bool:
        """Whether host RAM, not the decoder layers, bounds the weights offloaded."""
        return self.ram_room_bytes < min(self.weights_bytes, self.layer_bytes * self.layers)

    def largest_pool_bytes(self) -> int:
        """The KV pool left with every decoder layer's weights in host RAM."""
        return (
            self.budget_bytes
            - (self.weights_bytes - self.offloadable_bytes)
            - self.overhead_bytes
            - self.prefetch_buffer_bytes
        )


def served_weight_bytes(config: DeploymentConfig, model: ModelFacts) -> int:
    """The checkpoint's bytes at the dtype vLLM runs it in (a float32 checkpoint is served
    in 16 bits); quantised weights stay as stored."""
    if model.quantization is not None:
        return model.weight_bytes
    return int(
        model.weight_bytes * compute_dtype_bytes(model, config.model.dtype) / model.dtype_bytes
    )


def decoder_layer_bytes(model: ModelFacts, weight_bytes: int, dtype_bytes: int) -> int:
    """Weight bytes of one decoder layer: all weights less the embeddings (and an untied
    LM head) and any vision/audio towers, shared evenly; the unit the prefetch backend
    moves."""
    embeddings = model.vocab_size * model.hidden_size * dtype_bytes
    embeddings *= 1 if model.tie_word_embeddings else 2
    towers = sum(p.bytes for p in model.components if p.kind != "language model")
    towers = towers * weight_bytes // max(1, model.weight_bytes)  # at the served dtype
    return max(1, (weight_bytes - towers - embeddings) // max(1, model.num_layers))


def gpu_budget(inputs: PlanInputs, weight_bytes: int) -> GpuBudget:
    config, model, host = inputs.config, inputs.model, inputs.host
    tp, pp = config.parallel.tensor_parallel_size, config.parallel.pipeline_parallel_size
    if not host.gpus:
        raise PlanError("gpu", "no NVIDIA GPU found; plan for a card with --gpu-mem-gib N")
    total = min(g.total_bytes for g in host.gpus)
    # Tensor parallelism splits every layer; pipeline stages hold whole layers.
    layer = decoder_layer_bytes(model, weight_bytes, compute_dtype_bytes(model, config.model.dtype))
    layer //= tp
    prefetch = config.weights_offload.backend == "prefetch"
    return GpuBudget(
        total_bytes=total,
        budget_bytes=int(total * config.gpu.memory_utilization),
        # at the planned prefill chunk (plan.working_memory)
        overhead_bytes=gpu_overhead_bytes(model, config)
        + prefill_chunk(replace(inputs, platform="cuda")).working_bytes,
        weights_bytes=weight_bytes // (tp * pp),
        layer_bytes=layer,
        layers=max(1, model.num_layers // pp),
        # the GPU buffers offloaded layers are copied into
        prefetch_buffer_bytes=config.weights_offload.prefetch_step * layer if prefetch else 0,
        ram_room_bytes=weights_room_bytes(host, tp * pp),
    )
