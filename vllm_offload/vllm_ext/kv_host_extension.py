"""A KV block pool that goes on into host RAM, so that one request may be longer than
the GPU memory holds (patch 0006 calls this from vLLM's KV sizing and block pool).

The pool's last blocks are backed by pinned host memory mapped into the same CUDA
virtual range as its GPU blocks (``kv_host_mapping``: cuMemCreate with a host NUMA
location, not managed memory), so the unchanged attention kernels read them over PCIe,
bit-exactly. The block pool hands out GPU blocks first (``DeviceFirstFreeBlockQueue``):
while the GPU part has room, requests run as before. A step that reads host blocks pays
for their bytes crossing the link once per decode step (its prefill reads them once per
query tile), and so does every request batched with it; a request that finds the GPU
part full gets host blocks too, and keeps them. vLLM's KV usage and capacity log count
both parts (issue #22 and docs/design/long-context.md have the measurements).

Asked for per GPU with ``--additional-config '{"kv_host_extension_bytes": N}'``. Runs
inside vLLM's engine core; imports vLLM.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

from vllm_offload.vllm_ext import knobs
from vllm_offload.vllm_ext.knobs import HOST_EXTENSION_KEY

logger = init_logger("vllm.vllm_offload.kv_host_extension")  # printed as vLLM's own

# cuMemMap maps whole granules (2 MiB on NVIDIA GPUs): every run of GPU or host pages of
# the pool must start and end on one, in every layer's region.
MAP_GRANULE = 2 << 20


def extension_bytes(vllm_config: Any) -> int:
    """The host RAM asked for, per GPU (0: none); ValueError names the fix."""
    value = knobs.whole_number(vllm_config, HOST_EXTENSION_KEY, "bytes")
    if value:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda():
            raise ValueError(
                f"--additional-config {HOST_EXTENSION_KEY} needs an NVIDIA GPU (CUDA virtual "
                "memory maps host RAM into the pool); remove it on this platform"
            )
        if vllm_config.cache_config.num_gpu_blocks_override is not None:
            raise ValueError(
                f"--additional-config {HOST_EXTENSION_KEY} sizes the pool from memory; "
                "remove --num-gpu-blocks-override"
            )
        if vllm_config.model_config.enable_sleep_mode:
            raise ValueError(
                f"--additional-config {HOST_EXTENSION_KEY} and --enable-sleep-mode both own "
                "the KV cache's memory mapping; use one of them"
            )
    return value


def check_layout(layout: Any) -> None:
    """Layouts in which a block's bytes in one layer are one run (blocks outermost, or
    right inside the layer); in LHBNC each head of a layer has its own run of blocks."""
    if not (layout.is_block_outermost or layout.is_block_compact):
        raise ValueError(
            f"--additional-config {HOST_EXTENSION_KEY} cannot place the {layout.name} KV "
            "cache layout (each head's blocks apart); unset VLLM_KV_CACHE_LAYOUT or choose "
            "LBHNC"
        )


def check_groups(groups: list[Any]) -> None:
    """One full-attention cache group: the layouts this patch places (hybrid models and
    HiSparse pools are not placed yet)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    if len(groups) != 1 or type(groups[0].kv_cache_spec) is not FullAttentionSpec:
        kinds = ", ".join(type(g.kv_cache_spec).__name__ for g in groups) or "none"
        raise ValueError(
            f"--additional-config {HOST_EXTENSION_KEY} needs a model whose layers are all "
            f"full attention (one KV cache group); this one has: {kinds}. Remove it"
        )


def split_blocks(
    device_bytes: int, host_bytes: int, bytes_per_block: int, region_strides: list[int]
) -> tuple[int, int]:
    """(GPU blocks, host blocks): as many as each part holds, both multiples of the
    block count that keeps every GPU/host boundary on a granule. ``region_strides``:
    the bytes one block adds to each contiguous region (the page of each layer in a
    layer-outermost layout, the whole block in a block-outermost one)."""
    step = 1
    for stride in region_strides:
        step = math.lcm(step, MAP_GRANULE // math.gcd(MAP_GRANULE, stride))
    device = device_bytes // bytes_per_block // step * step
    host = host_bytes // bytes_per_block // step * step
    if device == 0:
        raise ValueError(
            f"--additional-config {HOST_EXTENSION_KEY}: the GPU holds no {step} whole "
            f"block(s) of {bytes_per_block} bytes (the smallest mappable part) for the "
            "pool's start; give the GPU pool more memory"
        )
    if host == 0:
        raise ValueError(
            f"--additional-config {HOST_EXTENSION_KEY}={host_bytes} holds no {step} whole "
            f"block(s) of {bytes_per_block} bytes (the smallest mappable part); give it at "
            f"least {step * bytes_per_block} bytes or remove it"
        )
    return device, host


def extend_pools_into_host_ram(
    vllm_config: Any,
    groups_per_worker: list[list[Any]],
    available_memory: list[int],
    pool_bytes_per_block: Callable[[list[Any]], int],
    layer_block_stride: Callable[[Any, str], int],
) -> tuple[list[int], int]:
    """With a host extension, each worker's memory for the pool becomes the same number
    of whole GPU blocks plus whole host blocks on every worker (the fewest any holds:
    pipeline stages differ in block size); returns it and the host blocks (0 without an
    extension). The callables are vLLM's own (its KV sizing module differs by release):
    a worker's bytes per block, and the bytes one block adds to a layer's region."""
    host_bytes = extension_bytes(vllm_config)
    if not host_bytes:
        return available_memory, 0
    layout = vllm_config.cache_config.get_resolved_kv_cache_layout()
    check_layout(layout)
    per_block, splits = [], []
    for groups, device_bytes in zip(groups_per_worker, available_memory, strict=True):
        check_groups(groups)
        per_block.append(pool_bytes_per_block(groups))
        region_strides = (
            [per_block[-1]]
            if layout.is_block_outermost
            else [layer_block_stride(group, name) for group in groups for name in group.layer_names]
        )
        splits.append(split_blocks(device_bytes, host_bytes, per_block[-1], region_strides))
    device = min(d for d, _ in splits)
    host = min(h for _, h in splits)
    return [(device + host) * b for b in per_block], host


def mark_host_blocks(kv_cache_configs: list[Any], host_blocks: int) -> None:
    """The blocks past the GPU part are the host extension's (the worker maps them)."""
    for kv_cache_config in kv_cache_configs:
        kv_cache_config.num_host_blocks = host_blocks


def log_split(kv_cache_config: Any, block_size: int, bytes_per_block: int) -> None:
    host = kv_cache_config.num_host_blocks
    if not host:
        return
    device = kv_cache_config.num_blocks - host
    logger.info(
        "KV pool host extension: %d blocks (%d tokens) in GPU memory, then %d blocks "
        "(%d tokens, %.2f GiB) in host RAM; GPU blocks are used first, a request whose KV "
        "reaches host blocks reads them over PCIe every step",
        device,
        device * block_size,
        host,
        host * block_size,
        host * bytes_per_block / (1 << 30),
    )


class DeviceFirstFreeBlockQueue:
    """The free blocks of a pool whose last blocks live in host RAM: one
    FreeKVCacheBlockQueue for the GPU blocks and one for the host blocks, each in vLLM's
    eviction order, and GPU blocks handed out first, so that a request reads host memory
    only when the GPU part is full. ``blocks``: all blocks of the pool, by block ID;
    ``first_host_block``: the ID of the first block backed by host RAM.
    ``gpu_allowance``: set by the scheduler (gpu_part) while it allocates for a
    long request: the most GPU blocks it may still take, each one counted, before host
    blocks (GPU ones again only once the host part is full); None: GPU blocks first."""

    def __init__(self, blocks: list[KVCacheBlock], first_host_block: int) -> None:
        self.first_host_block = first_host_block
        self.gpu_allowance: int | None = None
        self.device = FreeKVCacheBlockQueue(blocks[:first_host_block])
        self.host = FreeKVCacheBlockQueue(blocks[first_host_block:])

    @property
    def num_free_blocks(self) -> int:
        return int(self.device.num_free_blocks + self.host.num_free_blocks)

    def _queue_of(self, block: KVCacheBlock) -> FreeKVCacheBlockQueue:
        return self.host if block.block_id >= self.first_host_block else self.device

    def _split(self, blocks: list[KVCacheBlock]) -> tuple[list[KVCacheBlock], ...]:
        device = [b for b in blocks if b.block_id < self.first_host_block]
        host = [b for b in blocks if b.block_id >= self.first_host_block]
        return device, host

    def _from_device(self, n: int) -> int:
        """How many of the next ``n`` blocks come from the GPU part."""
        free = int(self.device.num_free_blocks)
        allowed = free if self.gpu_allowance is None else min(free, self.gpu_allowance)
        past = n - min(n, allowed)  # host blocks, while there are any
        return n - min(past, int(self.host.num_free_blocks))

    def popleft(self) -> KVCacheBlock:
        (block,) = self.popleft_n(1)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        device = self._from_device(n)
        if self.gpu_allowance is not None:
            self.gpu_allowance = max(0, self.gpu_allowance - device)
        got: list[KVCacheBlock] = self.device.popleft_n(device)
        return got + self.host.popleft_n(n - device)

    def remove(self, block: KVCacheBlock) -> None:
        self._queue_of(block).remove(block)

    def append(self, block: KVCacheBlock) -> None:
        self._queue_of(block).append(block)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        device, host = self._split(blocks)
        self.device.prepend_n(device)
        self.host.prepend_n(host)

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        device, host = self._split(blocks)
        self.device.append_n(device)
        self.host.append_n(host)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        got: list[KVCacheBlock] = self.device.get_all_free_blocks()
        return got + self.host.get_all_free_blocks()

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        if cursor is None or cursor.block_id < self.first_host_block:
            yield from self.device.iter_blocks_after(cursor)
            cursor = None
        yield from self.host.iter_blocks_after(cursor)
