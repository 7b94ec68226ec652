"""What a plan is: a record of records, one per part of the deployment, each figure with
its unit in its name, and the notes the steps left (decisions, warnings, problems).

``plan_json`` flattens it into the keys `plan --json`, the manager's page and the bench
read (each field's ``json`` name, in declaration order). ``PlanInputs`` is what the steps
of one model's plan carry, ``BoxInputs`` what planning several models starts from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Literal

from vllm_offload.config import DeploymentConfig
from vllm_offload.disk_facts import DiskFacts
from vllm_offload.errors import FieldError
from vllm_offload.hardware import HostFacts
from vllm_offload.model.facts import ModelFacts

Platform = Literal["cuda", "cpu"]
Backend = Literal["native", "lmcache", "none"]
Problem = dict[str, str]  # {"field": config key, "message": what is wrong and the fix}


class PlanError(FieldError):
    """The config cannot be served on this hardware; names the field and the fix.
    ``instead``: the overrides of that fix, where the planner can plan with them (so that
    `plan` shows the plan it would make, beside the refusal)."""

    def __init__(
        self, field: str, message: str, instead: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(field, message)
        self.instead = dict(instead or {})


def _key(name: str) -> dict[str, str]:
    """Field metadata: the flat JSON key of a field whose name differs from it."""
    return {"json": name}


@dataclass(frozen=True, kw_only=True)
class Notes:
    """What a step decided, warns about, or finds that forbids a start (the plan is still
    worth showing: `serve --dry-run` prints a GPU host's command anywhere)."""

    decisions: tuple[str, ...] = ()  # what each 'auto' became, and why
    warnings: tuple[str, ...] = ()
    unplanned: tuple[str, ...] = ()  # what the model folder had that could not be read
    problems: tuple[Problem, ...] = ()

    def __add__(self, other: Notes) -> Notes:
        return Notes(
            decisions=self.decisions + other.decisions,
            warnings=self.warnings + other.warnings,
            unplanned=self.unplanned + other.unplanned,
            problems=self.problems + other.problems,
        )

    @staticmethod
    def problem(field_name: str, message: str) -> Notes:
        return Notes(problems=({"field": field_name, "message": message},))


@dataclass(frozen=True, kw_only=True)
class KvLayout:
    """Where KV goes besides the GPU and how it is cut: the CPU tier's backend, the GPU
    block and the tier's chunk, the element type, and what a token and a block cost (per
    tensor-parallel rank, all layers)."""

    backend: Backend = field(metadata=_key("kv_offload_backend"))
    backend_reason: str = field(metadata=_key("kv_offload_backend_reason"))
    block_tokens: int = field(metadata=_key("block_size_tokens"))
    chunk_tokens: int = field(metadata=_key("cpu_chunk_tokens"))  # a multiple of the block
    cache_dtype: Literal["auto", "fp8"] = field(metadata=_key("kv_cache_dtype"))  # 'fit' resolved
    dtype_bytes: int = field(metadata=_key("kv_dtype_bytes"))
    bytes_per_token: int = field(metadata=_key("kv_bytes_per_token"))
    bytes_per_block: int = field(metadata=_key("kv_bytes_per_block"))


@dataclass(frozen=True, kw_only=True)
class Weights:
    """The weights at the dtype vLLM serves them, and how many bytes of them (per rank:
    vLLM's --cpu-offload-gb is per rank) live in host RAM."""

    bytes: int = field(metadata=_key("weight_bytes"))
    source: str = field(metadata=_key("weight_bytes_source"))
    gpu_bytes: int = field(metadata=_key("weights_gpu_bytes"))
    offloaded_bytes: int = field(metadata=_key("weights_offloaded_bytes"))
    # prefetch backend: every group_size layers, the last num_in_group live in host RAM
    # (vLLM's --offload-group-size / --offload-num-in-group); 0 otherwise.
    prefetch_group_size: int = field(metadata=_key("prefetch_group_size"))
    prefetch_num_in_group: int = field(metadata=_key("prefetch_num_in_group"))
    offloaded_layers: int = field(metadata=_key("weights_offloaded_layers"))
    # vision/audio towers, projector, language model: {"name", "kind", "bytes"} each
    components: tuple[dict[str, Any], ...] = field(default=(), metadata=_key("weight_components"))


@dataclass(frozen=True, kw_only=True)
class GpuPool:
    """One GPU's memory and the KV pool vLLM makes of it."""

    total_bytes: int = field(metadata=_key("gpu_total_bytes"))
    budget_bytes: int = field(metadata=_key("gpu_budget_bytes"))
    kv_pool_bytes: int = field(metadata=_key("gpu_kv_pool_bytes"))
    kv_pool_blocks: int = field(metadata=_key("gpu_kv_pool_blocks"))
    kv_pool_tokens: int = field(
        metadata=_key("gpu_kv_pool_tokens")
    )  # vLLM's "KV cache size: N tokens"


ChunkSource = Literal["vllm default", "host extension", "kept: larger costs pool", "configured"]


@dataclass(frozen=True, kw_only=True)
class PrefillChunk:
    """The most tokens vLLM computes in one step (--max-num-batched-tokens: a long prompt's
    prefill chunk), vLLM's own default for this card, and the working memory it costs."""

    tokens: int = field(metadata=_key("prefill_chunk_tokens"))
    source: ChunkSource = field(metadata=_key("prefill_chunk_source"))
    vllm_default_tokens: int = field(metadata=_key("vllm_default_chunk_tokens"))
    # the chunk the working memory's constants were measured at
    measured_tokens: int = field(metadata=_key("working_memory_measured_chunk_tokens"))
    # the activations of one chunk, as plan.working_memory models them
    activation_bytes: int = field(metadata=_key("prefill_chunk_activation_bytes"))
    # what they add to the working memory measured at the constants' own chunk (taken
    # from the GPU KV pool); 0 at or below it
    added_bytes: int = field(metadata=_key("prefill_chunk_added_bytes"))
    # a vision encoder's profile beside it: the visual tokens of the one item vLLM encodes
    # (0: none) and that pass's activations, also taken from the pool
    encoder_tokens: int = field(default=0, metadata=_key("vision_encoder_profile_tokens"))
    encoder_bytes: int = field(default=0, metadata=_key("vision_encoder_profile_bytes"))
    # the largest image's visual tokens, and whether its processor's max_pixels said so
    encoder_item_tokens: int = field(default=0, metadata=_key("vision_largest_image_tokens"))
    encoder_pixels_read: bool = field(default=False, metadata=_key("vision_max_pixels_read"))

    @property
    def working_bytes(self) -> int:
        """What the chunk and the encoder's profile add to the measured working memory."""
        return self.added_bytes + self.encoder_bytes


@dataclass(frozen=True, kw_only=True)
class Lengths:
    """How long one request may be, and how many such the pool holds."""

    longest_request_tokens: int  # must fit the GPU pool (and its host extension)
    model_max_tokens: int
    max_model_len: int
    source: Literal["configured", "auto"] = field(metadata=_key("max_model_len_source"))
    concurrency_at_full_length: float = field(metadata=_key("max_concurrency_at_full_length"))
    min_concurrent_requests: int = field(metadata=_key("min_concurrent_requests"))  # asked: gpu.*


@dataclass(frozen=True, kw_only=True)
class HostExtension:
    """Host RAM continuing the GPU KV pool (patch 0006), per GPU; 0: none."""

    bytes: int = field(metadata=_key("host_extension_bytes"))
    tokens: int = field(metadata=_key("host_extension_tokens"))
    # A max_model_len request's decode steps per second at most, if it spills.
    spilled_decode_steps_per_s_ceiling: float | None = field(
        metadata=_key("spilled_decode_steps_per_s_ceiling")
    )
    # GPU memory the staged prefill of spilled requests takes from the pool (issue #41),
    # and the spilled tokens of context it stages at once; 0 without an extension.
    staging_scratch_bytes: int = field(metadata=_key("staging_scratch_bytes"))
    staging_scratch_tokens: int = field(metadata=_key("staging_scratch_tokens"))


@dataclass(frozen=True, kw_only=True)
class CpuTier:
    """The CPU KV tier, all ranks together (for reuse and preemption)."""

    bytes: int = field(metadata=_key("cpu_tier_bytes"))
    blocks: int = field(metadata=_key("cpu_tier_blocks"))
    tokens: int = field(metadata=_key("cpu_tier_tokens"))
    # vLLM 0.33's sync-load budget a step (0: none asked, vLLM loads a hit asynchronously)
    sync_load_budget_bytes: int = field(default=0, metadata=_key("sync_load_budget_bytes"))


@dataclass(frozen=True, kw_only=True)
class HostRam:
    """The host's RAM and /dev/shm as planned against, and the largest CPU tier each holds
    once vLLM, offloaded weights and the host extension have theirs."""

    total_bytes: int = field(metadata=_key("ram_total_bytes"))
    available_bytes: int = field(metadata=_key("ram_available_bytes"))
    reserve_bytes: int = field(metadata=_key("ram_reserve_bytes"))
    shm_free_bytes: int = field(metadata=_key("shm_free_bytes"))
    server_bytes: int = field(metadata=_key("server_ram_bytes"))  # vLLM's own processes
    tier_room_ram_bytes: int = field(metadata=_key("cpu_tier_room_ram_bytes"))
    tier_room_shm_bytes: int = field(metadata=_key("cpu_tier_room_shm_bytes"))


@dataclass(frozen=True, kw_only=True)
class DiskTier:
    """The disk tier behind the CPU tier (0 bytes: none): its directory, the folder of this
    model's files in it, and the free space it keeps on that filesystem."""

    path: str = field(metadata=_key("disk_tier_path"))
    root: str = field(metadata=_key("disk_tier_root"))
    bytes: int = field(metadata=_key("disk_tier_bytes"))
    tokens: int = field(metadata=_key("disk_tier_tokens"))
    reserve_bytes: int = field(metadata=_key("disk_reserve_bytes"))


@dataclass(frozen=True, kw_only=True)
class Costs:
    """What weight offload costs: each decode step moves every offloaded byte host->GPU
    over this link."""

    h2d_bytes_per_s: float
    h2d_source: str
    decode_steps_per_s_ceiling: float | None  # None: no weights offloaded


@dataclass(frozen=True, kw_only=True)
class Plan:
    platform: Platform
    model_path: str
    architecture: str
    kv: KvLayout
    weights: Weights
    gpu: GpuPool
    prefill: PrefillChunk
    length: Lengths
    extension: HostExtension
    cpu_tier: CpuTier
    host_ram: HostRam
    disk: DiskTier
    tensor_parallel_size: int
    costs: Costs
    # Kernels chosen by rule, not by timing at start-up (server.reproducible, on a GPU).
    reproducible: bool
    # The vLLM release planned for: the installed one, else the platform's pin
    # (upstream.version.release_for); the launcher asks that release for what is planned.
    vllm_release: str
    notes: Notes

    def to_json(self) -> dict[str, Any]:
        return plan_json(self)


@dataclass(frozen=True, kw_only=True)
class PlanInputs:
    """What one model's plan is made from, as each step takes it: the config, the model's
    facts, the host, its platform, the vLLM release and the server's environment."""

    config: DeploymentConfig
    model: ModelFacts
    host: HostFacts
    platform: Platform
    vllm_release: str
    env: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class BoxInputs:
    """What a set of models is planned from: the whole config, each model's engine config
    and facts and disk tier's facts (by name, in the file's order), the host, its platform,
    the vLLM release and the server's environment."""

    config: DeploymentConfig
    engines: Mapping[str, DeploymentConfig]
    facts: Mapping[str, ModelFacts]
    disks: Mapping[str, DiskFacts | None]
    host: HostFacts
    platform: Platform
    vllm_release: str
    env: dict[str, str]


def plan_json(plan: Plan) -> dict[str, Any]:
    """The plan as one flat dict: every record's fields under their JSON names, in order
    (the keys `plan --json` has always printed)."""
    flat: dict[str, Any] = {}
    for part in fields(plan):
        value = getattr(plan, part.name)
        if not is_dataclass(value):
            flat[part.name] = value
            continue
        for item in fields(value):
            entry = getattr(value, item.name)
            flat[item.metadata.get("json", item.name)] = (
                [dict(e) if isinstance(e, dict) else e for e in entry]
                if isinstance(entry, tuple)
                else entry
            )
    return flat


def gib(n: float) -> str:
    """Bytes as the plan's words show them."""
    return f"{n / (1 << 30):,.2f} GiB"
