"""What a model asleep keeps (``plan.box``): GPU memory (its engine's context and graphs,
none where the driver checkpoints it: ``residency.deep_sleep``; and the weights it keeps
there: ``residency.asleep_weights_on_gpu_gib``), and whether those settings can be had."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.box_host import ASLEEP_GPU_BYTES, Idle
from vllm_offload.plan.budget import served_weight_bytes
from vllm_offload.plan.kv import compute_dtype_bytes
from vllm_offload.plan.records import Notes, Plan, gib


def weights_on_gpu_bytes(config: DeploymentConfig) -> int:
    """Bytes of its weights a model asleep keeps on the GPU, at most
    (residency.asleep_weights_on_gpu_gib; at level 1, not in deep sleep: refused there)."""
    residency = config.residency
    if residency.sleep_level != 1 or residency.deep_sleep:
        return 0
    return int(residency.asleep_weights_on_gpu_gib * GIB)


def asleep_gpu_bytes(config: DeploymentConfig, weights: int) -> int:
    """GPU memory a model asleep keeps: none where the driver checkpoints it; its weights
    kept there besides, no more than ``weights`` (the largest sleeper's, served)."""
    kept = min(weights_on_gpu_bytes(config), weights)
    return kept + (0 if config.residency.deep_sleep else ASLEEP_GPU_BYTES)


def largest_weights(
    configs: Mapping[str, DeploymentConfig], facts: Mapping[str, ModelFacts]
) -> int:
    """The largest of these models' weights as served (no model keeps more of its own)."""
    return max((served_weight_bytes(configs[n], facts[n]) for n in configs), default=0)


def host_copy_less(on_gpu: int, engine: DeploymentConfig, model: ModelFacts, plan: Plan) -> int:
    """How much smaller the host copy of a model asleep is for the weights it keeps on the
    GPU (``on_gpu`` at most: weights_on_gpu_bytes): what it may keep, less one allocation
    of its weight pool (the engine keeps whole ones, up to the bytes given; the largest is
    the embedding's or the head's), so that the copy is never counted smaller than it is."""
    kept = min(on_gpu, plan.weights.gpu_bytes)
    dtype = compute_dtype_bytes(model, engine.model.dtype)
    largest = model.vocab_size * model.hidden_size * dtype // plan.tensor_parallel_size
    return max(0, kept - largest) if kept else 0


def weights_on_gpu_notes(config: DeploymentConfig, idle: Idle) -> Notes:
    """Where residency.asleep_weights_on_gpu_gib cannot be had: refused, naming the fix."""
    residency = config.residency
    if not residency.asleep_weights_on_gpu_gib or idle != "sleep":
        return Notes()
    if residency.deep_sleep:
        return Notes.problem(
            "residency.asleep_weights_on_gpu_gib",
            "deep sleep moves all of a sleeping engine's GPU memory to host RAM, weights "
            "kept there too: set residency.asleep_weights_on_gpu_gib = 0 or "
            "residency.deep_sleep = false",
        )
    if residency.sleep_level != 1:
        return Notes.problem(
            "residency.asleep_weights_on_gpu_gib",
            "a level-2 sleep discards the weights (read again at the wake): set "
            "residency.asleep_weights_on_gpu_gib = 0 or residency.sleep_level = 1",
        )
    return Notes(
        decisions=(
            f"residency.asleep_weights_on_gpu_gib: each model asleep keeps up to "
            f"{gib(weights_on_gpu_bytes(config))} of its weights on the GPU (the last "
            "allocations of its weight pool: its last layers, and its head where the "
            "embedding is not it), so a switch copies that much less; the model on the GPU "
            "gets that much less of it for each one asleep beside it",
        )
    )


def deep_sleep(
    config: DeploymentConfig, idle: Idle, host: HostFacts, split: Sequence[str] = ()
) -> tuple[bool, Notes]:
    """Whether models asleep are checkpointed off the GPU (residency.deep_sleep): where
    they sleep, none of them is ``split`` over GPUs, and this host's driver can (a
    declared GPU's host is taken to)."""
    if not config.residency.deep_sleep:
        return False, Notes()
    if idle != "sleep":
        why = "residency.deep_sleep: no model sleeps here (they stop when away): nothing to move"
        return False, Notes(decisions=(why,))
    if split:
        return False, Notes.problem(
            "residency.deep_sleep",
            f"'{split[0]}' is split over several GPUs (tensor parallel), whose processes "
            "share GPU memory, which the driver's process checkpoint does not support "
            "(NVIDIA's cuda-checkpoint: no CUDA IPC): set residency.deep_sleep = false",
        )
    if host.gpu_source == "nvml" and not host.process_checkpoint:
        return False, Notes.problem(
            "residency.deep_sleep",
            "this NVIDIA driver cannot checkpoint a process (its libcuda has no "
            "cuCheckpointProcessLock: driver 570 or newer, on Linux): update the driver, or "
            "set residency.deep_sleep = false",
        )
    return True, Notes(
        decisions=(
            "residency.deep_sleep: a model asleep gives its engine's GPU memory (CUDA context "
            f"and graphs) to host RAM through the driver's process checkpoint: no GPU memory "
            f"is left for it, its host RAM counts {gib(ASLEEP_GPU_BYTES)} more, and a switch "
            "takes longer by the checkpoint and the restore (docs/several-models.md)",
        )
    )
