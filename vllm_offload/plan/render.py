"""The plan as the short human table `plan` and `serve` print: what goes where, how long one
request can be, then the decisions, warnings and problems."""

from __future__ import annotations

from vllm_offload.plan.records import Plan, gib
from vllm_offload.plan.working_memory import chunk_words, encoder_words


def render(plan: Plan) -> str:
    """The short human table: what goes where, and how long one request can be."""
    rows = _model_rows(plan) + _host_rows(plan)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines += [f"chose: {d}" for d in plan.notes.decisions]
    lines += [f"warning: {w}" for w in plan.notes.warnings]
    lines += [f"cannot start: {p['field']}: {p['message']}" for p in plan.notes.problems]
    return "\n".join(lines)


def _model_rows(plan: Plan) -> list[tuple[str, str]]:
    """The model, its weights, the pool and the lengths it serves."""
    kv, w, length, ext = plan.kv, plan.weights, plan.length, plan.extension
    return [
        ("model", f"{plan.architecture} at {plan.model_path}"),
        ("platform", f"{plan.platform}, planned for vLLM {plan.vllm_release}"),
        ("weights", f"{gib(w.bytes)} ({w.source})"),
        (
            "  on GPU / offloaded",
            f"{gib(w.gpu_bytes)} / {gib(w.offloaded_bytes)} per GPU"
            + (
                f" ({w.offloaded_layers} layers: the last {w.prefetch_num_in_group}"
                f" of every {w.prefetch_group_size}, prefetched)"
                if w.offloaded_layers
                else ""
            ),
        ),
        *_component_rows(plan),
        ("KV per token", f"{kv.bytes_per_token:,} bytes"),
        ("KV per block", f"{kv.bytes_per_block:,} bytes ({kv.block_tokens} tokens)"),
        (
            "GPU KV pool" if plan.platform == "cuda" else "KV pool (host RAM)",
            f"{gib(plan.gpu.kv_pool_bytes)} = {plan.gpu.kv_pool_blocks:,} blocks "
            f"= {plan.gpu.kv_pool_tokens:,} tokens",
        ),
        (
            "longest request",
            f"{length.longest_request_tokens:,} tokens "
            + (
                "(GPU pool + host extension)"
                if ext.bytes
                else "(must fit the GPU pool)"
                if plan.platform == "cuda"
                else "(must fit the pool)"
            ),
        ),
        (
            "max_model_len",
            f"{length.max_model_len:,} tokens ({length.source}; "
            f"model limit {length.model_max_tokens:,})",
        ),
        (
            "concurrency",
            f"{length.concurrency_at_full_length:.2f} requests at full length"
            + (
                f" (at least {length.min_concurrent_requests} asked)"
                if length.min_concurrent_requests > 1
                else ""
            ),
        ),
        ("KV cache dtype", f"{kv.cache_dtype} ({kv.dtype_bytes} bytes per element)"),
        *_chunk_rows(plan),
    ]


def _host_rows(plan: Plan) -> list[tuple[str, str]]:
    """What host RAM and the disk hold: the host extension, the CPU tier, the disk tier."""
    kv, ext, ram = plan.kv, plan.extension, plan.host_ram
    rows = [
        (
            "host extension",
            f"{gib(ext.bytes)} = {ext.tokens:,} tokens per GPU "
            "(continues the pool in host RAM; slower)"
            if ext.bytes
            else "none (kv_offload.host_extension_gib = 0)",
        ),
        *_staging_rows(plan),
        ("CPU KV tier", f"{kv.backend} ({kv.backend_reason})"),
        (
            "  size",
            f"{gib(plan.cpu_tier.bytes)} = {plan.cpu_tier.blocks:,} blocks = "
            f"{plan.cpu_tier.tokens:,} tokens (for reuse and preemption)",
        ),
        (
            "host RAM",
            f"{gib(ram.available_bytes)} available of "
            f"{gib(ram.total_bytes)}, reserve {gib(ram.reserve_bytes)}, "
            f"vLLM itself ~{gib(ram.server_bytes)}",
        ),
        ("/dev/shm free", gib(ram.shm_free_bytes)),
    ]
    if plan.disk.bytes:
        rows.append(
            (
                "disk KV tier",
                f"{gib(plan.disk.bytes)} = {plan.disk.tokens:,} tokens at "
                f"{plan.disk.path}, keeping {gib(plan.disk.reserve_bytes)} free (survives "
                "restarts)",
            )
        )
    return rows


def _component_rows(plan: Plan) -> list[tuple[str, str]]:
    """A multi-part model's components (issue #46): what weights_offload.params can name."""
    parts = plan.weights.components
    if len(parts) < 2:
        return []
    return [(f"  {p['name']}", f"{gib(p['bytes'])} ({p['kind']})") for p in parts]


def _staging_rows(plan: Plan) -> list[tuple[str, str]]:
    """The staged prefill's scratch, under the host extension it serves (issue #41)."""
    ext = plan.extension
    if not ext.staging_scratch_bytes:
        return []
    return [
        (
            "  staging scratch",
            f"{gib(ext.staging_scratch_bytes)} of GPU memory, taken from the pool, for the "
            f"prefill of requests that spill ({ext.staging_scratch_tokens:,} tokens of one layer "
            "at a time)",
        )
    ]


def _chunk_rows(plan: Plan) -> list[tuple[str, str]]:
    """The prefill chunk, where it is not vLLM's own default or costs the pool something."""
    chunk = plan.prefill
    rows = []
    if chunk.source != "vllm default" or chunk.added_bytes:
        rows.append(("prefill chunk", chunk_words(chunk)))
    if chunk.encoder_bytes:
        rows.append(("vision encoder", encoder_words(chunk)))
    return rows
