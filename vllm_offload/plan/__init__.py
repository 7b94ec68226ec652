"""The planner: (config, model facts, host facts) -> Plan. Pure; no I/O.

The rule it never bends: one request's KV must fit the GPU pool (with its host extension,
if configured), because vLLM never streams a request's blocks during attention. The CPU
tier holds blocks for *reuse* (prefix hits) and preemption; it does not make one request
longer. Every figure carries its unit in its name.

One module a topic, each step returning its part and its notes: ``layout`` (the CPU tier's
backend, blocks, chunks, KV dtype), ``gpu`` (the GPU budget and the weights), ``lengths``
(the pool in blocks, max_model_len, concurrency), ``host`` (RAM, the host extension, the
CPU tier), ``disk`` (the disk tier), ``checks`` (combinations vLLM refuses or runs badly),
``costs`` (what offload costs in decode speed), ``parts`` (weights_offload.params against
the model's components), ``staging`` (the GPU scratch a spilled
request's prefill stages its host blocks in), ``working_memory`` (vLLM's GPU working
memory and the prefill chunk it grows with; ``budget`` puts it beside the weights);
``records`` says what a plan is and
``render`` prints it. A new tier is a module here with a step called from ``make_plan``.
"""

from __future__ import annotations

from dataclasses import replace

from vllm_offload.config import DeploymentConfig
from vllm_offload.disk_facts import DiskFacts
from vllm_offload.hardware import HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.plan.budget import served_weight_bytes
from vllm_offload.plan.checks import combination_checks
from vllm_offload.plan.costs import h2d_bytes_per_s, offload_costs
from vllm_offload.plan.disk import plan_disk_tier
from vllm_offload.plan.gpu import GpuMemory, place_weights, weights_record
from vllm_offload.plan.host import (
    cpu_backend_ram_check,
    extension_bytes,
    size_cpu_tier,
    sync_load_budget,
)
from vllm_offload.plan.kv import compute_dtype_bytes, kv_bytes_per_token
from vllm_offload.plan.layout import choose_layout, planned_model
from vllm_offload.plan.lengths import (
    PoolShape,
    capacity_warnings,
    fit_lengths,
    past_the_model_limit,
    target,
)
from vllm_offload.plan.parts import offload_notes
from vllm_offload.plan.records import (
    GpuPool,
    HostExtension,
    Notes,
    Plan,
    PlanError,
    PlanInputs,
    Platform,
    plan_json,
)
from vllm_offload.plan.render import render
from vllm_offload.plan.reproducible import kernel_choice
from vllm_offload.plan.staging import StagingScratch, staging_scratch
from vllm_offload.plan.working_memory import chunk_notes, prefill_chunk
from vllm_offload.upstream.version import PINNED

__all__ = [
    "Plan",
    "PlanError",
    "Platform",
    "compute_dtype_bytes",
    "h2d_bytes_per_s",
    "kv_bytes_per_token",
    "make_plan",
    "plan_json",
    "render",
]


def make_plan(
    config: DeploymentConfig,
    model: ModelFacts,
    host: HostFacts,
    platform: Platform,
    *,
    env: dict[str, str] | None = None,
    disk: DiskFacts | None = None,
    vllm_release: str | None = None,
) -> Plan:
    """Resolve every 'auto' of ``config`` into numbers, or raise PlanError; for
    ``vllm_release`` (default: the platform's pinned release)."""
    env = env or {}
    release = vllm_release or PINNED[platform]
    asked = PlanInputs(
        config=config, model=model, host=host, platform=platform, vllm_release=release, env=env
    )
    notes = Notes(
        warnings=tuple(f"could not read {what}" for what in model.unknown), unplanned=model.unknown
    )
    notes += past_the_model_limit(asked)
    layout, step = choose_layout(asked)
    notes += step
    # The steps after the layout plan the model as vLLM does with its backend.
    planned = planned_model(model, layout.backend)
    inputs = replace(asked, model=planned)
    chunk = prefill_chunk(inputs)  # its activations: in place_weights
    notes += chunk_notes(chunk)
    memory, step = place_weights(inputs, layout, target(config, planned))
    notes += step
    if platform == "cpu":
        cpu_backend_ram_check(inputs, memory.weights_gpu_bytes, memory.kv_pool_bytes)
    notes += offload_notes(
        asked, memory.weights_offloaded_bytes, served_weight_bytes(config, planned)
    )
    extension, step = extension_bytes(inputs)
    notes += step
    # Staged prefill's GPU scratch comes out of the pool (only a GPU maps an extension).
    staged = extension if platform == "cuda" else 0
    scratch, step = staging_scratch(inputs, layout, memory.kv_pool_bytes, staged)
    notes += step
    memory = replace(memory, kv_pool_bytes=memory.kv_pool_bytes - scratch.bytes)
    shape, length, step = fit_lengths(inputs, layout, memory.kv_pool_bytes, extension)
    notes += step
    tier, ram, step = size_cpu_tier(inputs, layout, memory.weights_offloaded_bytes, extension)
    notes += step
    tier = replace(
        tier, sync_load_budget_bytes=sync_load_budget(inputs, layout, memory.kv_pool_bytes)
    )
    disk_tier, step = plan_disk_tier(inputs, disk, layout, length.max_model_len)
    notes += step
    notes += capacity_warnings(layout, tier, length, shape, bool(extension))
    # Not checked: the memlock limit. cudaHostRegister ignores it (an H200 host registered
    # 4 GiB at full speed under an 8 MiB limit without CAP_IPC_LOCK: benchmarks/results/
    # h200-vllm-0.32.0/host-checks/), so refusing a tier for it would refuse what works.
    notes += combination_checks(asked, layout.backend)
    costs, spilled_ceiling, step = offload_costs(inputs, layout, memory, shape, length, extension)
    notes += step
    reproducible, step = kernel_choice(asked)
    notes += step
    return Plan(
        platform=platform,
        model_path=model.path,
        architecture=model.architecture,
        kv=layout,
        weights=weights_record(config, planned, memory),
        gpu=_gpu_pool(memory, shape),
        prefill=chunk,
        length=length,
        extension=_host_extension(
            extension, shape.extension_blocks * layout.block_tokens, scratch, spilled_ceiling
        ),
        cpu_tier=tier,
        host_ram=ram,
        disk=disk_tier,
        tensor_parallel_size=config.parallel.tensor_parallel_size,
        costs=costs,
        reproducible=reproducible,
        vllm_release=release,
        notes=notes,
    )


def _gpu_pool(memory: GpuMemory, shape: PoolShape) -> GpuPool:
    """The GPU's budget and the KV pool left in it, in bytes, blocks and tokens."""
    return GpuPool(
        total_bytes=memory.total_bytes,
        budget_bytes=memory.budget_bytes,
        kv_pool_bytes=memory.kv_pool_bytes,
        kv_pool_blocks=shape.gpu_blocks,
        kv_pool_tokens=shape.gpu_tokens,
    )


def _host_extension(
    size: int, tokens: int, scratch: StagingScratch, spilled_ceiling: float | None
) -> HostExtension:
    """The host extension of ``size`` bytes (``tokens``), the GPU scratch its staged
    prefill takes from the pool, and a spilled request's decode speed at most."""
    return HostExtension(
        bytes=size,
        tokens=tokens,
        spilled_decode_steps_per_s_ceiling=spilled_ceiling,
        staging_scratch_bytes=scratch.bytes,
        staging_scratch_tokens=scratch.tokens,
    )
