"""vLLM's GPU working memory besides the weights and the KV pool (CUDA context, the
activation peak of its profile run, CUDA graphs), and the prefill chunk it grows with
(vLLM's max_num_batched_tokens: the profile run pushes one chunk of that many tokens
through the model).

The constants are measurements, each taken at one chunk. A larger planned chunk adds its
extra activations (``activation_bytes``, a model with one measured point) to them; a
smaller one keeps the measured figure (the model is not trusted to take memory away from
a measurement, and vLLM measures the real pool at start-up anyway)."""

from __future__ import annotations

from vllm_offload.config import DeploymentConfig
from vllm_offload.hardware import GIB, HostFacts
from vllm_offload.model.facts import ModelFacts
from vllm_offload.model.vision import DEFAULT_MAX_PIXELS, VisionProfile
from vllm_offload.plan.kv import compute_dtype_bytes
from vllm_offload.plan.records import ChunkSource, Notes, PlanInputs, Platform, PrefillChunk, gib

# Measured on an H100 with an 8B shape (docs/benchmarks.md), scaled with the model's
# hidden size; vLLM's API server chunk there was its default for cards of 70 GiB or more.
GPU_OVERHEAD_BASE_BYTES = int(1.0 * GIB)
GPU_OVERHEAD_PER_HIDDEN_BYTES = 128 * 1024
DENSE_MEASURED_CHUNK_TOKENS = 8192
# CUDA graphs (vLLM's default; none with --enforce-eager): since vLLM 0.21 the start-up
# profile also takes the graphs' memory from the pool (vLLM estimated 0.52 GiB for a
# Llama-3.2-1B shape, 0.91-0.92 for 3B and 8B). Measured on an H200 (vLLM 0.33.0, chunks of
# 8,192), what a dense model's pool lost beside the constants above: Llama-3.2-1B shape
# 0.75 GiB, 3B 1.08, Llama-3-8B 1.13-1.14 (at utilization 0.15, 0.25 and 0.42), where the
# 8B shape without graphs kept 117.37 GiB for 117.36 planned (benchmarks/results/
# h200-vllm-0.33.0/dense-graphs/, weights/). A fixed part and a little per hidden unit,
# at least 0.1 GiB above every point (one run each; vLLM's graphs grow with its capture
# sizes): 1.10 / 1.20 / 1.29 GiB.
GPU_OVERHEAD_CUDA_GRAPHS_BYTES = int(0.9 * GIB)
GPU_OVERHEAD_CUDA_GRAPHS_PER_HIDDEN_BYTES = 100 * 1024
# A mixture-of-experts model's profile peaks higher (its fused-MoE kernels' workspaces and
# routing buffers). Measured with CUDA graphs, which this includes (eager not measured):
# Qwen3-Coder-30B-A3B AWQ (hidden 2,048, 128 experts), vLLM 0.33.0, 2,048 batched tokens,
# a 21.60 GiB budget: on an H100 vLLM kept a 4.22 GiB pool where the two base constants
# alone gave 4.70 (0.48 GiB short, benchmarks/results/fork-case-h100-vllm-0.33.0/fp8.log);
# on an H200 at the same budget, 4.09 GiB (fork-case-h200-vllm-0.33.0/fp8-bf16-model/
# fp8.log.xz), 0.61 GiB short. The larger of the two, rounded up: all three together are
# that model's working memory at 2,048 tokens, so that the pool the plan prints is one
# vLLM gives on both.
GPU_OVERHEAD_MOE_BYTES = int(0.65 * GIB)
MOE_MEASURED_CHUNK_TOKENS = 2048
# A vision-language model's, besides its encoder's profile (``encoder_bytes``), CUDA
# graphs included (eager not measured): a Qwen2.5-VL-7B shape on an H200 (vLLM 0.33.0,
# utilization 0.42, chunks of 8,192) kept a pool 0.84-0.92 GiB below what the base
# constants and the encoder's activations gave, at three image budgets (vLLM counted 15.67
# GiB of weights for 15.44 in the files, 0.95 GiB of non-torch memory and ~1.1 GiB of its
# language model's chunk; benchmarks/results/vlm-h200-vllm-0.33.0/). The largest, rounded up.
GPU_OVERHEAD_VISION_BYTES = int(0.95 * GIB)
# With a host extension and staged prefill, each prefill chunk copies the host part of a
# spilled request's context once per layer, so the bytes over PCIe fall as 1/chunk. The
# TTFT floor on an H100 (docs/design/long-context.md, "The chunk decides the floor"):
# 2,048 tokens 1.48x/1.80x the all-GPU time at 65,536/130,000 tokens, 8,192 1.13x/1.21x
# (measured: 1.14x/1.20x), 16,384 1.08x/1.11x. 8,192 is the smallest chunk inside the
# 1.5x goal at both lengths, and the one measured; each doubling past it buys less time
# for twice the activations (an 8B model: +0.9 GiB of pool at 16,384).
STAGED_PREFILL_CHUNK_TOKENS = 8192


def gpu_overhead_bytes(model: ModelFacts, config: DeploymentConfig) -> int:
    """The measured working memory, at the constants' own chunk (``measured_chunk``). The
    mixture-of-experts and vision constants were measured with CUDA graphs and include
    them; a dense text model's graphs are counted apart (none with --enforce-eager)."""
    working = GPU_OVERHEAD_BASE_BYTES + model.hidden_size * GPU_OVERHEAD_PER_HIDDEN_BYTES
    working += GPU_OVERHEAD_MOE_BYTES if model.experts else 0
    working += GPU_OVERHEAD_VISION_BYTES if model.vision else 0
    if not model.experts and not model.vision and cuda_graphs(config):
        working += GPU_OVERHEAD_CUDA_GRAPHS_BYTES
        working += model.hidden_size * GPU_OVERHEAD_CUDA_GRAPHS_PER_HIDDEN_BYTES
    return working


def cuda_graphs(config: DeploymentConfig) -> bool:
    """Whether vLLM captures CUDA graphs: unless extra_args turns --enforce-eager on (the
    last of --enforce-eager / --no-enforce-eager wins, as in vLLM's parser, which reads
    underscores as dashes). Other ways to turn graphs off (-O0, a compilation config) are
    not read: the plan then counts graphs vLLM does not make, a smaller pool."""
    eager = False
    for arg in config.extra_args:
        flag = arg.replace("_", "-")
        if flag in ("--enforce-eager", "--no-enforce-eager"):
            eager = flag == "--enforce-eager"
    return not eager


def measured_chunk(model: ModelFacts) -> int:
    return MOE_MEASURED_CHUNK_TOKENS if model.experts else DENSE_MEASURED_CHUNK_TOKENS


def vllm_default_chunk(host: HostFacts, platform: Platform, world: int) -> int:
    """vLLM 0.32.0's max_num_batched_tokens for its OpenAI server when none is given
    (EngineArgs.get_batch_defaults, by the first GPU's NVML total and name; 0.33.0 also
    keeps a GB10 on the smallest). vLLM lowers it further only for a max_model_len x
    max_num_seqs below it, and raises it without chunked prefill or with
    `--performance-mode throughput`, none of which the planner sees."""
    if platform == "cpu":
        return 2048 * world
    memory = host.gpus[0].total_bytes if host.gpus else 0
    name = host.gpus[0].name.lower() if host.gpus else ""
    if memory >= 160 * GIB:
        return 16384
    if memory >= 70 * GIB and "a100" not in name:
        return 8192
    return 2048


def activation_bytes(model: ModelFacts, dtype_bytes: int, tokens: int, tp: int = 1) -> int:
    """One chunk's activation peak on one rank: a model with one measured point (the 8B
    shape, 0.8-0.9 GiB at 8,192 tokens). A dense MLP holds its gate/up output and the
    activation (3 x intermediate, split over ``tp`` ranks) beside ~4 hidden-wide tensors
    (residual, norm, attention output) per token; a mixture of experts holds vLLM's
    fused-MoE workspaces instead (Triton's and Marlin's ``workspace_shapes``: tokens x
    top-k x (max(I, H) + max(2 I, H)), I an expert's width on the rank)."""
    hidden = model.hidden_size
    inter = (model.intermediate_size or 4 * hidden) // tp
    per_token = dense_elements(hidden, inter)
    if model.experts:
        expert = model.moe_intermediate_size // tp or inter
        workspaces = model.experts_per_token * (max(expert, hidden) + max(2 * expert, hidden))
        per_token = max(per_token, workspaces + 4 * hidden)  # dense layers may peak higher
    return per_token * dtype_bytes * tokens


def dense_elements(hidden: int, inter: int) -> int:
    """A dense transformer layer's activations a token, in elements: the MLP's gate/up
    output and the activation (3 x ``inter``) beside ~4 ``hidden``-wide tensors."""
    return 3 * inter + 4 * hidden


def encoder_bytes(vision: VisionProfile, dtype_bytes: int, tokens: int) -> int:
    """The vision encoder's activations in vLLM's profile of ``tokens`` visual tokens: the
    dense formula on the vision transformer's shape, per patch (vision_profile)."""
    per_patch = dense_elements(vision.width, vision.intermediate)
    return tokens * vision.patches_per_token * per_patch * dtype_bytes


def prefill_chunk(inputs: PlanInputs) -> PrefillChunk:
    """gpu.prefill_chunk_tokens resolved, and what it adds to the working memory."""
    config, model, host, platform = inputs.config, inputs.model, inputs.host, inputs.platform
    world = config.parallel.ranks
    default = vllm_default_chunk(host, platform, world)
    asked = config.gpu.prefill_chunk_tokens
    dtype_b = compute_dtype_bytes(model, config.model.dtype)
    # staged prefill extends FlashAttention, which vLLM does not run a float32 model with
    staged = config.kv_offload.host_extension_gib > 0 and config.kv_offload.staged_prefill
    staged = staged and platform == "cuda" and dtype_b <= 2
    source: ChunkSource = "vllm default"
    tokens = default
    if asked != "auto":
        source, tokens = "configured", asked
    if asked == "auto" and staged and default < STAGED_PREFILL_CHUNK_TOKENS:
        # Only where the working memory was measured at a chunk this large (its
        # activations already counted): one that takes them from the pool puts more of a
        # long request in host RAM, which every decode step reads (measured on the fork's
        # MoE: 8,192 cut its first token by 8 % and its decode by 21 %,
        # fork-case-h200-vllm-0.33.0).
        if measured_chunk(model) >= STAGED_PREFILL_CHUNK_TOKENS:
            source, tokens = "host extension", STAGED_PREFILL_CHUNK_TOKENS
        else:
            source = "kept: larger costs pool"
    tp = config.parallel.tensor_parallel_size
    activations = activation_bytes(model, dtype_b, tokens, tp)
    added = activations - activation_bytes(model, dtype_b, measured_chunk(model), tp)
    vision = model.vision if platform == "cuda" else None
    encoder = vision.profile_tokens(tokens) if vision else 0
    return PrefillChunk(
        tokens=tokens,
        source=source,
        vllm_default_tokens=default,
        measured_tokens=measured_chunk(model),
        activation_bytes=activations,
        added_bytes=max(0, added) if platform == "cuda" else 0,
        encoder_tokens=encoder,
        encoder_bytes=encoder_bytes(vision, dtype_b, encoder) if vision else 0,
        encoder_item_tokens=vision.max_item_tokens if vision else 0,
        encoder_pixels_read=bool(vision and vision.max_pixels_from == "preprocessor_config.json"),
    )


def chunk_notes(chunk: PrefillChunk) -> Notes:
    """Why 'auto' left vLLM's default (a host extension's staged prefill)."""
    if chunk.source == "kept: larger costs pool":
        return Notes(
            decisions=(
                f"gpu.prefill_chunk_tokens auto stays at vLLM's {chunk.tokens:,} beside the "
                f"host extension: {STAGED_PREFILL_CHUNK_TOKENS:,} tokens' activations (this "
                "model's expert workspaces) would come out of the GPU pool and put more of "
                "a long request in host RAM, read every decode step; on the fork's "
                "Qwen3-Coder-30B-A3B (H200, vLLM 0.33.0) 8,192 cut the first token by 8 % "
                "and decode by 21 %. Set it to trade one for the other",
            )
        )
    if chunk.source != "host extension":
        return Notes()
    return Notes(
        decisions=(
            f"gpu.prefill_chunk_tokens auto -> {chunk.tokens:,}: a spilled request's staged "
            "prefill copies its host blocks once per layer and chunk, so "
            f"{chunk.tokens / chunk.vllm_default_tokens:g}x fewer chunks copy them than at "
            f"vLLM's default {chunk.vllm_default_tokens:,} here (65,536 tokens on an H100: "
            "24.9 GB instead of 89.0, a TTFT floor of 1.13x the all-GPU time instead of "
            "1.48x; docs/design/long-context.md)",
        )
    )


def chunk_words(chunk: PrefillChunk) -> str:
    """The chunk, what its activations cost against vLLM's default, and whether the pool
    pays for it (a row of `plan`)."""
    default = chunk.vllm_default_tokens
    apart = chunk.activation_bytes * abs(chunk.tokens - default) // chunk.tokens
    more = "more" if chunk.tokens > default else "less"
    versus = f" ({gib(apart)} {more} than at {default:,})" if apart else ""
    pays = (
        f"+{gib(chunk.added_bytes)} of working memory, taken from the GPU KV pool"
        if chunk.added_bytes
        else "within the working memory the plan counts (measured at "
        f"{chunk.measured_tokens:,} tokens)"
    )
    why = (
        "vLLM's default here"
        if chunk.source == "vllm default"
        else f"{chunk.source}; vLLM's default here {default:,}"
    )
    activations = f"activations ~{gib(chunk.activation_bytes)}{versus}"
    return f"{chunk.tokens:,} tokens ({why}): {activations}; {pays}"


def encoder_words(chunk: PrefillChunk) -> str:
    """What the vision encoder's profile takes from the pool, and why that much (a row of
    `plan`)."""
    source = (
        "preprocessor_config.json's max_pixels"
        if chunk.encoder_pixels_read
        else f"no max_pixels read: planned at {DEFAULT_MAX_PIXELS:,} pixels"
    )
    largest = f"; the largest image {chunk.encoder_item_tokens:,} tokens ({source})"
    return (
        f"{gib(chunk.encoder_bytes)} of working memory, taken from the GPU KV pool: vLLM "
        f"profiles its encoder with one item of {chunk.encoder_tokens:,} visual tokens, the "
        f"larger of the prefill chunk and the largest image{largest}"
    )
