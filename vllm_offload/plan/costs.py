"""What offloading costs in decode speed: every decode step moves each offloaded weight
byte, and each byte of a request's KV spilled into the host extension, over the PCIe link
once; the link's speed bounds the steps per second."""

from __future__ import annotations

from vllm_offload.hardware import HostFacts
from vllm_offload.plan.gpu import GpuMemory
from vllm_offload.plan.kv import KvSizing, request_kv_bytes
from vllm_offload.plan.lengths import PoolShape
from vllm_offload.plan.records import Costs, KvLayout, Lengths, Notes, PlanInputs, gib
from vllm_offload.vllm_ext.spill_share import long_part

# Host->GPU copy speed of registered memory over PCIe Gen5 x16, measured on an H200
# (benchmarks/results/h200-vllm-0.32.0/weights/pinned_memory.json, 2 MiB blocks). Other
# links are this scaled by their transfer rate and width; every weight-offload decode step
# reads all offloaded bytes over it (UVA) or copies them in (prefetch).
H2D_GEN5_X16_BYTES_PER_S = 55.47e9
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
# Without a GPU to ask (a declared card): the link of an RTX 4090 / A6000-class card.
ASSUMED_PCIE = (4, 16)


def h2d_bytes_per_s(host: HostFacts) -> tuple[float, str]:
    """Host->GPU copy speed of registered memory on this host's link, and where it is from."""
    gpu = min(host.gpus, key=lambda g: (g.pcie_generation or 99, g.pcie_width or 99), default=None)
    gen, width = (gpu.pcie_generation, gpu.pcie_width) if gpu else (None, None)
    link = "read from NVML"
    if gen not in PCIE_GT_PER_S or not width:
        (gen, width), link = ASSUMED_PCIE, "assumed: no GPU here to ask"
    speed = H2D_GEN5_X16_BYTES_PER_S * PCIE_GT_PER_S[gen] / PCIE_GT_PER_S[5] * width / 16
    how = "measured on an H200" if (gen, width) == (5, 16) else "an H200's Gen5 x16 figure scaled"
    return speed, f"PCIe Gen{gen} x{width}, {link}; {how}"


def offload_costs(
    inputs: PlanInputs,
    layout: KvLayout,
    memory: GpuMemory,
    shape: PoolShape,
    lengths: Lengths,
    extension: int,
) -> tuple[Costs, float | None, Notes]:
    """The weight-offload decode ceiling, and (with a host extension) a max_model_len
    request's: (costs, that request's ceiling rounded, the decisions that say them)."""
    model, tp = inputs.model, inputs.config.parallel.tensor_parallel_size
    speed, source = h2d_bytes_per_s(inputs.host) if inputs.platform == "cuda" else (0.0, "no GPU")
    offloaded = memory.weights_offloaded_bytes
    ceiling = speed / offloaded if offloaded and speed else None
    # The GPU part as aligned for the extension; below share 1 the long requests keep at
    # most half of it (vllm_ext/gpu_part: later requests find GPU blocks); the rest it reads
    # every step.
    whole_part = shape.gpu_blocks * layout.bytes_per_block if extension else memory.kv_pool_bytes
    gpu_part = whole_part
    if extension and inputs.config.kv_offload.spilled_step_share < 1:
        gpu_part = long_part(shape.gpu_blocks) * layout.bytes_per_block
    max_len = lengths.max_model_len
    kv = KvSizing(
        model=model, dtype_bytes=layout.dtype_bytes, block_tokens=layout.block_tokens, tp=tp
    )
    request = request_kv_bytes(kv, max_len)
    spilled = max(0, request - gpu_part)
    if extension:  # past the host part, its blocks come from the GPU again
        spilled = min(spilled, shape.extension_blocks * layout.bytes_per_block)
    spilled_ceiling = speed / spilled if extension and spilled and speed else None
    decisions = []
    if extension:
        decisions.append(
            extension_decision(
                share=inputs.config.kv_offload.spilled_step_share,
                max_len=max_len,
                extension=extension,
                extension_tokens=shape.extension_blocks * layout.block_tokens,
                spilled=spilled,
                spilled_alone=min(spilled, max(0, request - whole_part)),
                link=(speed, source),
            )
        )
    if ceiling is not None:
        decisions.append(
            f"decode speed cost: each step moves {gib(offloaded)} of weights host->GPU at "
            f"~{speed / 1e9:.1f} GB/s ({source}): at most {ceiling:.1f} steps/s, "
            "i.e. tokens/s per request"
        )
    costs = Costs(
        h2d_bytes_per_s=speed,
        h2d_source=source,
        decode_steps_per_s_ceiling=None if ceiling is None else round(ceiling, 2),
    )
    rounded = None if spilled_ceiling is None else round(spilled_ceiling, 2)
    return costs, rounded, Notes(decisions=tuple(decisions))


def extension_decision(
    *,
    share: float,
    max_len: int,
    extension: int,
    extension_tokens: int,
    spilled: int,
    spilled_alone: int,
    link: tuple[float, str],
) -> str:
    """What the host extension holds, and what a max_model_len request spilled into it
    decodes at, alone and beside others (kv_offload.spilled_step_share); ``link``: the
    host-to-GPU speed and where it is from; ``spilled_alone``: what it would put there
    holding the whole GPU part (share 1: one user's speed, everyone else's wait)."""
    speed, source = link
    head = (
        f"host extension: {gib(extension)} per GPU = {extension_tokens:,} tokens of KV in host RAM "
        "after the GPU pool, used once the GPU's blocks are taken; "
    )
    if not (spilled and speed):
        return head + "no request of max_model_len tokens reaches it alone"
    ceiling = speed / spilled
    return head + (
        f"a {max_len:,}-token request puts {gib(spilled)} there"
        + (" (host blocks first once it holds half the GPU pool)" if share < 1 else "")
        + f", which every decode step reads over PCIe at ~{speed / 1e9:.1f} GB/s ({source}): "
        f"at most {ceiling:.1f} tokens/s for it alone, about {ceiling * share:.1f} beside other "
        f"requests, whose steps it joins in at most {share:.0%} of the time "
        "(kv_offload.spilled_step_share)"
        + (
            f"; at share 1 it would take the whole GPU part first: {gib(spilled_alone)} "
            f"there, {speed / spilled_alone:.1f} tokens/s alone, but every request batched "
            "with it waits for its host reads"
            if share < 1 and spilled_alone and spilled_alone < spilled
            else ""
        )
    )
