"""The KV pool's backing allocation with a host extension (kv_host_extension): one CUDA
virtual range, GPU runs in GPU memory and host runs in pinned host RAM on the GPU's NUMA
node (cuMemCreate with a host location, not managed memory), so vLLM's attention kernels
read both unchanged. Patch 0006's hunk in vLLM's worker calls ``allocate``; imports
vLLM's logger and CUDA's driver bindings (cuda-bindings, a vLLM dependency).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from vllm.logger import init_logger

from vllm_offload.vllm_ext.knobs import HOST_EXTENSION_KEY
from vllm_offload.vllm_ext.kv_host_extension import MAP_GRANULE

logger = init_logger("vllm.vllm_offload.kv_host_mapping")  # printed as vLLM's own

# Per GPU ordinal, the pool allocated last: (its blocks, the first in host RAM). Staged
# prefill (staged_attention) reads it: the attention impl sees the pool's views only.
_SPLITS: dict[int, tuple[int, int]] = {}


def pool_split(device: torch.device) -> tuple[int, int] | None:
    """(blocks, first host block) of the pool on ``device``; None without an extension."""
    return _SPLITS.get(device.index if device.index is not None else 0)


def host_ranges(kv_cache_config: Any) -> list[tuple[int, int]]:
    """Byte ranges of the backing allocation that hold only host blocks (the last
    ``num_host_blocks`` of every layer), merged and sorted."""
    first = kv_cache_config.num_blocks - kv_cache_config.num_host_blocks
    last = kv_cache_config.num_blocks
    spans = []
    for tensor in kv_cache_config.kv_cache_tensors:
        if tensor.block_stride > tensor.layer_stride:  # block-outermost: all layers per block
            spans.append((first * tensor.block_stride, last * tensor.block_stride))
            continue
        for layer in range(len(tensor.layers)):
            start = tensor.offset + layer * tensor.layer_stride
            spans.append((start + first * tensor.block_stride, start + last * tensor.block_stride))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def mapped_runs(
    size: int, host: list[tuple[int, int]], granule: int
) -> list[tuple[int, int, bool]]:
    """(start, end, on host) runs covering ``size`` bytes rounded up to the granule; a
    boundary off a granule is a ValueError (``split_blocks`` chose the counts so that
    none is)."""
    total = -(-size // granule) * granule
    runs: list[tuple[int, int, bool]] = []
    at = 0
    for start, end in host:
        if start > at:
            runs.append((at, start, False))
        runs.append((start, end, True))
        at = end
    if at < total:
        runs.append((at, total, False))
    for start, end, _ in runs:
        if start % granule or end % granule:
            at = start if start % granule else end
            raise ValueError(
                f"KV host extension: a GPU/host boundary at byte {at} is not on the "
                f"{granule}-byte mapping granule"
            )
    return runs


def _ok(result: Any) -> Any:
    from cuda.bindings import driver

    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(
            f"KV host extension: CUDA driver call failed: {err}. Host allocations need an "
            "NVIDIA driver with CUDA >= 12.2 and the RAM to pin: lower "
            f"{HOST_EXTENSION_KEY} (vllm-offload: kv_offload.host_extension_gib)"
        )
    return rest[0] if len(rest) == 1 else rest


class _Mapping:
    """The mapped range as a CUDA array; the tensor viewing it holds this object, and
    when both are gone the range is unmapped and its memory given back (an engine
    rebuilt in the same process does not leak it)."""

    def __init__(self, address: int, size: int, total: int, handles: list[Any]) -> None:
        weakref.finalize(self, _unmap, address, total, handles)
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|i1",
            "data": (address, False),
            "version": 3,
        }


def _unmap(address: int, total: int, handles: list[Any]) -> None:
    from cuda.bindings import driver

    try:
        torch.cuda.synchronize()  # nothing may still read or write the range
        driver.cuMemUnmap(address, total)
        for handle in handles:
            driver.cuMemRelease(handle)
        driver.cuMemAddressFree(address, total)
    except Exception:  # at interpreter exit the context may be gone: the OS frees it all
        pass


def allocate(kv_cache_config: Any, size: int, device: torch.device) -> torch.Tensor:
    """The zeroed int8 backing of ``size`` bytes: host ranges in pinned host RAM on the
    GPU's NUMA node, the rest in GPU memory, one virtual range."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise RuntimeError(
            f"KV host extension: the cuda-bindings package is missing ({exc}); "
            "pip install cuda-bindings, or remove --additional-config " + HOST_EXTENSION_KEY
        ) from exc
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    try:  # the host NUMA node nearest the GPU (CUDA >= 12.2; -1: none)
        numa = _ok(
            driver.cuDeviceGetAttribute(
                driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, ordinal
            )
        )
    except (AttributeError, RuntimeError):
        numa = -1

    def properties(on_host: bool) -> Any:
        prop = driver.CUmemAllocationProp()
        prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        location = driver.CUmemLocationType
        prop.location.type = (
            location.CU_MEM_LOCATION_TYPE_HOST_NUMA
            if on_host
            else location.CU_MEM_LOCATION_TYPE_DEVICE
        )
        prop.location.id = max(numa, 0) if on_host else ordinal
        return prop

    flag = driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    granule = max(
        int(_ok(driver.cuMemGetAllocationGranularity(properties(h), flag))) for h in (False, True)
    )
    if MAP_GRANULE % granule:
        raise RuntimeError(
            f"KV host extension: this GPU maps in {granule}-byte granules, the pool was "
            f"aligned to {MAP_GRANULE}; remove --additional-config {HOST_EXTENSION_KEY}"
        )
    runs = mapped_runs(size, host_ranges(kv_cache_config), MAP_GRANULE)
    total = runs[-1][1]
    address = int(_ok(driver.cuMemAddressReserve(total, MAP_GRANULE, 0, 0)))
    handles = []
    for start, end, on_host in runs:
        handle = _ok(driver.cuMemCreate(end - start, properties(on_host), 0))
        handles.append(handle)
        _ok(driver.cuMemMap(address + start, end - start, 0, handle, 0))
    access = driver.CUmemAccessDesc()
    access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = ordinal
    access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _ok(driver.cuMemSetAccess(address, total, [access], 1))
    buf = torch.as_tensor(_Mapping(address, size, total, handles), device=device)
    buf.zero_()
    first_host = kv_cache_config.num_blocks - kv_cache_config.num_host_blocks
    _SPLITS[ordinal] = (kv_cache_config.num_blocks, first_host)
    host_bytes = sum(end - start for start, end, on_host in runs if on_host)
    logger.info(
        "KV host extension mapped: %.2f GiB in GPU memory, %.2f GiB pinned in host RAM "
        "(NUMA node %d), %d runs",
        (total - host_bytes) / (1 << 30),
        host_bytes / (1 << 30),
        max(numa, 0),
        len(runs),
    )
    return buf
