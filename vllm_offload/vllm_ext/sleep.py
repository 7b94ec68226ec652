"""Sleep with one host arena (several models on one GPU, issue #31).

vLLM's level-1 sleep backs each GPU allocation it keeps (the weights, and at every level
its runtime and CUDA-graph pools) up in a torch-pinned host tensor of its own. torch's
pinned allocator rounds each one up to a power of two and keeps the memory after the
wake: an 8B model's engine grew 17.6 GiB for 15.6 GiB of weights (H200, issue #31), and
held it. This backend copies the same allocations into one exact-size buffer of pageable
memory registered with the GPU (made at the first sleep, kept for the next ones, which
then cost only the copies), and lets vLLM's allocator release them without a backup of
its own; at the wake it copies them back into the memory the allocator maps again (and, with
VLLMOFFLOAD_SLEEP_KEEP_COPY=0, residency.host_copy = 'release', gives the arena back once
all is copied: the next sleep makes it again and copies everything out). In an
engine the wake is the copy: an 8B model's engine mapped its 23.5 GiB in 0.04 s and had
copied its 15.5 GiB by 0.37 s on an H200; starting each copy as soon as its allocation was
mapped changed nothing (benchmarks/results/h200-vllm-0.33.0/wake/). The weights are
copied out once: they do not change while the engine serves (the front door sends
engines no route that reloads them), so a later level-1 sleep of the same allocations
finds their copy still valid and releases them at once; a level-2 sleep (weights read
again at the wake), other allocations or a larger arena copy them again. (vLLM's expert
load balancing, `--enable-eplb`, moves expert weights while serving: not for an engine
that sleeps.) With VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES (residency.
asleep_weights_on_gpu_gib) a level-1 sleep leaves the last weight allocations (vLLM
allocates in the model's order: its last layers, and its head where the embedding is not
it) whose sizes add up to no more than that mapped on the GPU, out of the arena: a wake
copies only the rest (issue #58: the copy is the switch). vLLM's allocator is shown them
asleep for its sleep (which then passes them over) and awake again after it (so its wake
does not map them).

vLLM chooses its sleep-mode backend by name (``ModelConfig.sleep_mode_backend``, default
"cumem"); with VLLMOFFLOAD_SLEEP_ARENA=1 (the launcher sets it for engines that sleep)
the general plugin registers this class under that name, so vLLM's own worker picks it.
vLLM 0.33 adds ``--sleep-mode-backend`` and ``SleepModeBackendFactory.register_backend``,
but a backend of another name loses the CUDA-graph pool: ``VllmConfig.
use_cumem_cudagraph_pool`` puts the graphs in the memory sleep releases only for the name
"cumem", so this one keeps that name on both releases. Runs inside vLLM's worker; imports
vLLM.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from vllm.device_allocator import DEFERRABLE_TAGS
from vllm.device_allocator.cumem import CuMemAllocator, create_and_map, libcudart
from vllm.device_allocator.sleep_mode_backend import CuMemBackend
from vllm.logger import init_logger

from vllm_offload.vllm_ext import SLEEP_BACKEND_LINE
from vllm_offload.vllm_ext.knobs import SLEEP_KEEP_COPY_ENV, SLEEP_WEIGHTS_ON_GPU_ENV, env_bytes

logger = init_logger("vllm.vllm_offload.sleep")  # under vLLM's logger: printed as its own

BACKED_UP_AT_EVERY_LEVEL = ("runtime", "cudagraph")  # as vLLM's CuMemBackend keeps them
PAGE = mmap.PAGESIZE
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction from the addresses (unified addressing)


@dataclass(frozen=True)
class Saved:
    ptr: int  # the allocation's GPU address (the allocator maps it there again)
    offset: int  # where its bytes wait in the arena
    size: int


class HostArena:
    """Pageable memory, registered with the GPU once, exactly as large as asked (page
    rounded): no power-of-two rounding, no second copy."""

    def __init__(self, size: int) -> None:
        self.size = -(-size // PAGE) * PAGE
        self._map = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.ptr = torch.frombuffer(self._map, dtype=torch.uint8).data_ptr()
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        result = cudart.cudaHostRegister(self.ptr, self.size, 0)
        if int(getattr(result, "value", result)) != 0:
            raise RuntimeError(f"cudaHostRegister of {self.size} bytes failed ({result})")

    def close(self) -> None:
        torch.cuda.cudart().cudaHostUnregister(self.ptr)  # type: ignore[no-untyped-call]
        self._map.close()


class ArenaBackend(CuMemBackend):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._arena: HostArena | None = None
        self._saved: list[Saved] = []
        # The weights as the arena holds them since the last level-1 sleep: weights do not
        # change while an engine serves, so the next level-1 sleep skips their copy (the
        # bulk of a put-away) where the same allocations are asleep again.
        self._weights_kept: list[tuple[int, int]] = []  # (address, size), arena offsets in order
        self._keep_copy = os.environ.get(SLEEP_KEEP_COPY_ENV, "1") != "0"
        self._on_gpu_bytes = env_bytes(SLEEP_WEIGHTS_ON_GPU_ENV, 0)
        # Set by the layered wake's worker for one resume: the weights, where the arena
        # holds them, are neither mapped nor copied there but left to map_and_copy (held,
        # by address, until each is mapped and its copy queued).
        self.hold_weights = False
        self.held: dict[int, Saved] = {}

    def suspend(self, level: int = 1) -> None:
        allocator = CuMemAllocator.get_instance()
        awake = [
            (ptr, data.handle[1], data.tag)
            for ptr, data in allocator.pointer_to_data.items()
            if not data.is_asleep
        ]
        weights = (
            [(ptr, size) for ptr, size, tag in awake if tag == "weights"] if level == 1 else []
        )
        stay = _last_within(weights, self._on_gpu_bytes)
        weights = weights[: len(weights) - len(stay)]
        others = [(ptr, size) for ptr, size, tag in awake if tag in BACKED_UP_AT_EVERY_LEVEL]
        copy_weights = bool(weights) and weights != self._weights_kept
        total = sum(size for _ptr, size in weights + others)
        if total and (self._arena is None or self._arena.size < total):  # none for 0 bytes
            if self._arena is not None:
                self._arena.close()
                self._arena, self._weights_kept = None, []  # if the next one fails
            self._arena = HostArena(total)
            copy_weights = bool(weights)
            logger.info("vllm-offload sleep arena: %.2f GiB registered", total / (1 << 30))
        arena = self._arena
        self._saved, offset = [], 0
        for index, (ptr, size) in enumerate(weights + others):  # weights first: offsets kept
            assert arena is not None
            if copy_weights or index >= len(weights):
                libcudart.cudaMemcpy(arena.ptr + offset, ptr, size)
            self._saved.append(Saved(ptr, offset, size))
            offset += size
        self._weights_kept = weights  # none after a level-2 sleep
        self._state = "SUSPENDED"
        staying = [allocator.pointer_to_data[ptr] for ptr, _size in stay]
        for data in staying:  # vLLM's sleep passes over what it sees asleep
            data.is_asleep = True
        try:  # the rest released: the arena holds what is kept, the GPU what stays
            allocator.sleep(offload_tags=())
        finally:  # awake to vLLM's allocator: its wake maps only what slept
            for data in staying:
                data.is_asleep = False
        if self._on_gpu_bytes and level == 1:
            logger.info(
                "vllm-offload sleep arena: %.2f GiB of weights stay on the GPU (%d "
                "allocations; %.2f GiB asked: the last allocations within it)",
                sum(size for _ptr, size in stay) / (1 << 30),
                len(stay),
                self._on_gpu_bytes / (1 << 30),
            )

    def resume(self, tags: list[str] | None = None) -> None:
        allocator = CuMemAllocator.get_instance()
        self._state = "RESUMING"
        began = time.perf_counter()
        held = {ptr for ptr, _size in self._weights_kept} if self._holds(tags) else set()
        if held:  # every deferrable tag asked for but the weights
            tags = [tag for tag in (tags or DEFERRABLE_TAGS) if tag != "weights"]
            self.held.update((saved.ptr, saved) for saved in self._saved if saved.ptr in held)
            self._saved = [saved for saved in self._saved if saved.ptr not in held]
        allocator.wake_up(tags)
        mapped, copied = time.perf_counter() - began, 0
        arena = self._arena
        waiting = []
        for saved in self._saved:
            if arena is not None and not allocator.pointer_to_data[saved.ptr].is_asleep:
                libcudart.cudaMemcpy(saved.ptr, arena.ptr + saved.offset, saved.size)
                copied += saved.size
            else:
                waiting.append(saved)  # a tag woken later (kv_cache first, weights after)
        self._saved = waiting
        self._state = "RUNNING"
        if arena is not None and not waiting and not self._keep_copy:
            arena.close()  # residency.host_copy = 'release': the next sleep copies all out
            self._arena, self._weights_kept = None, []
            logger.info("vllm-offload sleep arena: given back (residency.host_copy = release)")
        logger.info(
            "vllm-offload sleep arena: woke %s: mapped in %.3f s, %.2f GiB copied by %.3f s%s",
            "all" if tags is None else ",".join(tags),
            mapped,
            copied / (1 << 30),
            time.perf_counter() - began,
            f"; {len(self.held)} weight allocations held for a layered wake" if held else "",
        )

    def _holds(self, tags: list[str] | None) -> bool:
        """Whether this resume leaves the weights to map_and_copy: asked by the layered
        wake, the weights among the tags woken, their copy whole in the arena (a level-1
        sleep's) and kept after the wake (with the arena given back at the wake, its
        copies must end first)."""
        return (
            self.hold_weights
            and (tags is None or "weights" in tags)
            and bool(self._weights_kept)
            and self._arena is not None
            and self._keep_copy
        )

    def map_and_copy(self, address: int, stream: int | None) -> None:
        """One held weight allocation mapped again and its copy from the arena queued on
        ``stream`` (a CUDA stream handle: the layered wake's, in the order it chooses), or
        made at once (None: what is left held after a failure)."""
        assert self._arena is not None
        saved = self.held[address]
        data = CuMemAllocator.get_instance().pointer_to_data[address]
        if data.is_asleep:
            create_and_map(data.handle)
            data.is_asleep = False
        source = self._arena.ptr + saved.offset
        if stream is None:
            libcudart.cudaMemcpy(address, source, saved.size)
        else:
            result = _memcpy_async()(address, source, saved.size, _MEMCPY_DEFAULT, stream)
            if result != 0:
                raise RuntimeError(f"cudaMemcpyAsync of {saved.size} bytes failed ({result})")
        del self.held[address]


def _last_within(allocations: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """The last (address, size) allocations whose sizes add up to no more than ``budget``."""
    taken = 0
    for count, (_ptr, size) in enumerate(reversed(allocations)):
        if taken + size > budget:
            return allocations[len(allocations) - count :]
        taken += size
    return allocations[:]


def _memcpy_async() -> Any:
    """libcudart's cudaMemcpyAsync, from the library vLLM loaded (its CudaRTLibrary binds
    the synchronous copy only)."""
    function = libcudart.lib.cudaMemcpyAsync
    if function.argtypes is None:  # without them ctypes passes each address as a C int
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        function.argtypes += [ctypes.c_int, ctypes.c_void_p]
        function.restype = ctypes.c_int
    return function


def register() -> None:
    """Make this the backend vLLM's default name selects."""
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory

    SleepModeBackendFactory._registry["cumem"] = lambda: ArenaBackend
    print(SLEEP_BACKEND_LINE, file=sys.stderr, flush=True)  # the front door waits for it
