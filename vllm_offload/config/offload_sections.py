"""The offload sections of the config (``[kv_offload]``, ``[weights_offload]``): the CPU
tier, the host extension and what shares the GPU beside it, the disk tier, and the
weights kept in host RAM. Types, bounds and the descriptions that feed ``--help``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from vllm_offload.config.sections import MAX_GIB, PARAM_NAME, Auto, _bounded_gib, _Section

KvOffloadBackend = Literal["auto", "native", "lmcache", "none"]


# Below it a spilled request waits ~100 times its step between steps: it hardly moves.
MIN_SPILLED_STEP_SHARE = 0.01


class KvOffloadSection(_Section):
    backend: KvOffloadBackend = Field(
        "auto",
        description="CPU tier for the KV cache: 'native' (vLLM's OffloadingConnector), "
        "'lmcache', 'none', or 'auto' (native where an NVIDIA GPU is present, else none).",
    )
    cpu_tier_gib: float | Auto = Field(
        "auto",
        description="Host RAM for the CPU KV tier, in GiB. 'auto': what the planner finds "
        "free after a reserve for the OS and offloaded weights.",
    )
    block_size: int | Auto = Field(
        "auto",
        description="Tokens per GPU KV block (vLLM --block-size); the CPU tier stores whole "
        "blocks. 'auto': 128 with the native CPU tier (fewer copies per CPU hit) on plain "
        "attention models, else 16 on NVIDIA GPUs; 128 on the CPU backend (it needs a "
        "multiple of 32).",
    )
    cpu_chunk_tokens: int | Auto = Field(
        "auto",
        description="Tokens the CPU tier moves as one chunk (a multiple of block_size); "
        "bigger chunks mean fewer, larger copies, but a prompt's last partial chunk stays "
        "GPU-only. 'auto': 256 with the native tier (or one block, if bigger).",
    )
    eviction_policy: Literal["lru", "arc"] = Field(
        "lru", description="Which CPU-tier blocks to drop when the tier is full."
    )
    store_threshold: int = Field(
        0,
        ge=0,
        le=64,
        description="Copy a chunk to the CPU tier only once it has been looked up this "
        "many times (0 or 1: store every chunk). 2 skips prompts never seen again, at "
        "the price of missing the first reuse.",
    )
    layerwise_loads: bool = Field(
        True,
        description="Load a CPU-tier hit inside the step that computes the rest of its "
        "prompt, one layer after another, each layer's attention waiting only for its own "
        "blocks: the copy overlaps the computation and no step is lost in between (vLLM "
        "0.32.0 and 0.33.0, patch 0005). The other requests of that step wait for the copies too. "
        "false: vLLM's way, the request waits out of the batch until its whole load is in "
        "(or, on vLLM 0.33 with sync_load_budget_gib, vLLM's sync loads).",
    )
    sync_load_budget_gib: float | Auto = Field(
        "auto",
        description="vLLM 0.33's sync loads: CPU-tier hits of up to this many GiB per step "
        "load inside that step, on an expedited stream; more wait out of the batch as "
        "before. With layerwise_loads each layer's attention waits for its own blocks, "
        "else vLLM's worker waits for the whole load before the step. 'auto': the GPU KV "
        "pool with layerwise_loads (no limit, as on 0.32), else 0 (vLLM's default: no sync "
        "loads). vLLM 0.32 has no sync loads and ignores it.",
    )
    host_extension_gib: float = Field(
        0.0,
        ge=0.0,
        le=MAX_GIB,
        description="Host RAM, in GiB per GPU, that continues the GPU KV pool, so that one "
        "request may be longer than the GPU holds (vLLM 0.32.0 and 0.33.0, patch 0006; "
        "NVIDIA GPUs, models whose layers are all full attention). The GPU's blocks are "
        "used first; a request whose KV reaches these blocks reads them over PCIe: every "
        "decode step moves its spilled bytes once, and its prefill copies them once per "
        "layer and chunk (staged_prefill). Not the CPU tier (cpu_tier_gib: prefix reuse), "
        "which it is taken from first. 0: off.",
    )
    staged_prefill: bool = Field(
        True,
        description="With host_extension_gib: a prefill chunk of a request whose KV reaches "
        "host RAM copies its context into GPU scratch once per layer (vLLM 0.33.0; the "
        "scratch, one layer's worth of the longest request, comes out of the GPU pool and "
        "plan shows it). false: no scratch, the prefill reads host blocks in place once "
        "per query tile of the kernel (tens of times slower).",
    )
    spilled_step_share: float = Field(
        0.1,
        ge=MIN_SPILLED_STEP_SHARE,
        le=1.0,
        description="With host_extension_gib: while other requests run or wait, the steps that "
        "include a request whose KV reaches host RAM (a long one: from its first prefill "
        "chunk) take at most this share of the "
        "GPU's time, its host reads included (vllm_ext.fair_scheduler); the steps "
        "between run the others without it, at GPU speed. Each such step is a pause for"
        " the chats in flight (~0.18 s for 6 GB): at 0.1 a chat of ~130 tokens sees at "
        "most one. The share counts only the time they are together: what is left of "
        "the wait after such a step when the others leave is left when others come "
        "again, and where long requests first meet others the first step waits half the "
        "wait after a 0.25 s one (1.125 s at 0.1), or after the decode step it is taking "
        "alone as they come (0.63 s at 0.1 for a 0.14 s step): a wave of chats shorter "
        "than that meets none; a "
        "long request waiting for its first chunk too. Measured (H200, vLLM 0.33.0, 8B "
        "shape, 2 GiB GPU pool + 12 GiB host extension, chats of 256 tokens in and 128 "
        "out beside a 60,000-token request, "
        "docs/benchmarks.md): at 0.1 every chat's mean time per token was within 1.25x "
        "and its p99 gap within 2.9x of the same chat alone once the long request "
        "decodes (waves of 16 and 32, waves of 8, steady arrivals), the long request "
        "decoding at 1.4-4.4 tokens/s beside them (7.0 alone); at 0.15, 6 of those 144 "
        "chats were over a goal; at 0.25 (another run), 32 of the 48 chats in the waves"
        " of 16 and 32. While it prefills beside chats, each of its chunks is sized to "
        "take ~0.25 s from the last one's rate (8,192-token chunks took 0.6 s at 60,000 "
        "tokens; a first chunk from the last first chunk's) and launched once the step in "
        "flight is handed over, and short prompts waiting with it go first: chats arriving "
        "before, with or during its prefill were within 1.44x (H100); before it 16 of 16 "
        "were within both goals, with it 12 of 16, during its prefill 58 of 60 (a vLLM "
        "pool that holds the prompt: 0 and 8 of 16 before and with it). "
        "Below 1, the long requests also hold at most half the GPU pool "
        "together before their new blocks come from host RAM, and a short request waits"
        " for GPU blocks rather than read host ones, so that requests arriving later "
        "run at GPU speed. 1: none of it, every request batched with a spilled one "
        "waits for its host reads every step (17x). At least 0.01.",
    )
    disk_path: str = Field(
        "",
        description="Directory of the disk tier behind the CPU tier (an NVMe filesystem, "
        "not tmpfs): KV chunks the CPU tier evicts are kept there, and found again after "
        "a restart. Empty: no disk tier. Native backend only. Set in the file only: the "
        "manager's API cannot change it.",
    )
    disk_gib: float | Auto = Field(
        "auto",
        description="Most GiB the disk tier may hold (least recently used chunks go first); "
        "it also always leaves a free-space reserve on that filesystem (5 %, at least 10 "
        "GiB). 'auto': half of the filesystem's size less that reserve.",
    )
    num_cpu_blocks: int | None = Field(
        None,
        ge=1,
        description="Deprecated (seed fork): CPU tier size in GPU blocks. Translated to "
        "cpu_tier_gib with a warning; set cpu_tier_gib instead.",
    )

    _bounded = field_validator("cpu_tier_gib", "disk_gib", "sync_load_budget_gib")(_bounded_gib)

    @field_validator("spilled_step_share", mode="before")
    @classmethod
    def _share_is_a_number(cls, value: object) -> object:
        if isinstance(value, bool):  # pydantic reads true as 1.0: share 1 by accident
            raise ValueError("must be a number from 0.01 to 1, not true or false")
        return value

    @model_validator(mode="after")
    def _positive_tier(self) -> KvOffloadSection:
        if isinstance(self.cpu_tier_gib, float) and self.cpu_tier_gib < 0:
            raise ValueError("cpu_tier_gib must be >= 0 or 'auto'")
        if isinstance(self.disk_gib, float) and self.disk_gib <= 0:
            raise ValueError("disk_gib must be > 0 or 'auto' (no disk tier: disk_path = '')")
        if self.disk_path and not self.disk_path.startswith("/"):
            raise ValueError("disk_path must be an absolute path (or '' for no disk tier)")
        if isinstance(self.cpu_chunk_tokens, int) and not 1 <= self.cpu_chunk_tokens <= 65536:
            raise ValueError("cpu_chunk_tokens must be 1-65536 tokens or 'auto'")
        if isinstance(self.block_size, int) and (
            self.block_size < 1 or self.block_size > 4096 or self.block_size & (self.block_size - 1)
        ):
            raise ValueError("block_size must be a power of two from 1 to 4096, or 'auto'")
        return self


class WeightsOffloadSection(_Section):
    cpu_gib: float | Auto = Field(
        0.0,
        description="GiB of weights kept in host RAM and streamed to the GPU each step "
        "(vLLM --cpu-offload-gb). 'auto': the fewest that let the GPU KV pool hold "
        "model.max_model_len x gpu.min_concurrent_requests tokens (max_model_len 'auto': "
        "what does not fit the GPU, with room for one 4,096-token request).",
    )
    params: list[str] = Field(
        default_factory=list,
        description="Only offload parameters whose names contain one of these as whole "
        "dot-separated parts (vLLM --cpu-offload-params): a tower by its module name "
        "('visual' for Qwen2.5-VL, 'vision_tower' for LLaVA and Gemma 3), a decoder layer's "
        "by names inside the layer ('mlp', 'self_attn.qkv_proj'). `plan` lists the model's "
        "components; a pattern that matches nothing vLLM offloads is refused. Empty: any.",
    )
    backend: Literal["uva", "prefetch"] = Field(
        "uva",
        description="'uva': the GPU reads pinned host memory directly; "
        "'prefetch': whole decoder layers live in host RAM and are copied in ahead of use "
        "(cpu_gib is rounded up to whole layers, spread evenly over the model).",
    )
    prefetch_step: int = Field(
        1,
        ge=1,
        le=8,
        description="prefetch backend: layers copied ahead; each costs one layer of GPU memory.",
    )

    _bounded = field_validator("cpu_gib")(_bounded_gib)

    @model_validator(mode="after")
    def _non_negative(self) -> WeightsOffloadSection:
        if isinstance(self.cpu_gib, float) and self.cpu_gib < 0:
            raise ValueError("cpu_gib must be >= 0 or 'auto'")
        return self

    @field_validator("params")
    @classmethod
    def _param_names(cls, params: list[str]) -> list[str]:
        for name in params:
            if not PARAM_NAME.fullmatch(name):
                raise ValueError(
                    f"{name[:40]!r} is not part of a parameter name: use letters, digits, _ "
                    "and . (e.g. 'visual', 'mlp.down_proj'), not starting with '.'"
                )
        return params
