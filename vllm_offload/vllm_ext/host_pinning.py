"""Offloaded weights in one exact-size arena of pageable memory, registered with
cudaHostRegister slice by slice, instead of one torch-pinned tensor each.

torch's pinned allocator rounds every allocation up to a power of two: 8 GiB of
offloaded weights took 9.37 GiB of host RAM on vLLM 0.32.0 unpatched, 8.09 GiB in the
arena (benchmarks/results/h200-vllm-0.32.0/weights/). Pageable memory from an
anonymous mmap costs exactly its size and, once registered, is read at the pinned
speed. Budgets at or above the gate (VLLMOFFLOAD_PIN_REGISTER_MIN_BYTES, default 256 MiB)
take that path; smaller ones keep torch's pinned allocator. If registration fails
(memlock limit, driver), the weights stay torch-pinned and one warning says so.
Prefetch weight offload places its parameters in an unsized arena (it learns the total
only while loading); 0.32.0 unpatched pinned each one twice, rounded (2.34x the
offloaded bytes), because loading copied every processed weight into a new pinned
tensor (model_loader/utils.py's hunk now copies it back into its own storage).
(vLLM's CPU KV tier needs none of this: it maps and registers an exact-size /dev/shm
region itself.) Called by patch 0002's hunks in vLLM's offloaders; imports vLLM.
"""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Protocol

import torch
from vllm.logger import init_logger

from vllm_offload.vllm_ext.knobs import PIN_REGISTER_MIN_ENV, env_bytes

logger = init_logger("vllm.vllm_offload.host_pinning")  # under vLLM's logger: printed as its own

DEFAULT_GATE_BYTES = 256 << 20
CHUNK_BYTES = 1 << 30
PAGE = mmap.PAGESIZE
# An arena is address space; pages are committed only as tensors are placed. Without
# NORESERVE the kernel's overcommit heuristic may refuse a reservation as large as RAM.
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


class Registrar(Protocol):
    def register(self, ptr: int, num_bytes: int) -> bool: ...

    def unregister(self, ptr: int) -> None: ...


class CudaRegistrar:
    """cudaHostRegister / cudaHostUnregister through torch's cudart binding."""

    def register(self, ptr: int, num_bytes: int) -> bool:
        cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
        result = cudart.cudaHostRegister(ptr, num_bytes, 0)
        if int(getattr(result, "value", result)) != 0:
            torch.cuda.synchronize()  # clear the sticky error state of the failed call
            return False
        return True

    def unregister(self, ptr: int) -> None:
        torch.cuda.cudart().cudaHostUnregister(ptr)  # type: ignore[no-untyped-call]


_warned = False


def gate_bytes() -> int:
    """The gate from the environment; a non-numeric value is a start-up error."""
    return env_bytes(PIN_REGISTER_MIN_ENV, DEFAULT_GATE_BYTES)


def should_register(num_bytes: int, pin: bool, gate: int | None = None) -> bool:
    """Register (pageable + cudaHostRegister) rather than torch-pin this buffer?"""
    return pin and num_bytes >= (gate_bytes() if gate is None else gate)


def _warn_unpinned(num_bytes: int, what: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "cudaHostRegister failed for %s (%.2f GiB); it stays pageable, and host<->GPU "
            "copies from pageable memory run about 4-6x slower than pinned. Raise the "
            "memlock limit (ulimit -l, systemd LimitMEMLOCK=infinity) to pin it.",
            what,
            num_bytes / (1 << 30),
        )


def register_chunks(
    ptr: int, num_bytes: int, registrar: Registrar, chunk_bytes: int, what: str
) -> list[int] | None:
    """Register [ptr, ptr+num_bytes) in chunks; all or none. Returns the chunk pointers."""
    done: list[int] = []
    for offset in range(0, num_bytes, chunk_bytes):
        size = min(chunk_bytes, num_bytes - offset)
        if not registrar.register(ptr + offset, size):
            for chunk in done:
                registrar.unregister(chunk)
            _warn_unpinned(num_bytes, what)
            return None
        done.append(ptr + offset)
    return done


def _unregister_all(registrar: Registrar, chunks: list[int]) -> None:
    for chunk in chunks:
        registrar.unregister(chunk)


class HostArena:
    """Exact-size home for many small tensors (UVA weight offload): one lazily
    committed anonymous mapping; each tensor gets a page-aligned slice that is
    registered on its own, so only the bytes placed are committed and pinned."""

    def __init__(self, capacity_bytes: int, registrar: Registrar | None = None) -> None:
        self.capacity = max(PAGE, -(-capacity_bytes // PAGE) * PAGE)
        self._buffer = mmap.mmap(
            -1, self.capacity, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
        )
        self._base = torch.frombuffer(self._buffer, dtype=torch.uint8)
        self._used = 0
        self._registrar = registrar or CudaRegistrar()
        self._chunks: list[int] = []
        self.placed_bytes = 0
        weakref.finalize(self, _unregister_all, self._registrar, self._chunks)

    def place(self, source: torch.Tensor, what: str = "offloaded weights") -> torch.Tensor | None:
        """A registered CPU copy of ``source``, or None when it does not fit or pinning fails."""
        num_bytes = source.numel() * source.element_size()
        start = self._used
        end = start + -(-num_bytes // PAGE) * PAGE
        if end > self.capacity:
            return None
        view = self._base[start : start + num_bytes].view(source.dtype).view(source.shape)
        # Register before copying, so the copy from the GPU runs at the pinned speed.
        chunks = register_chunks(view.data_ptr(), num_bytes, self._registrar, CHUNK_BYTES, what)
        if chunks is None:
            return None
        view.copy_(source)
        self._chunks.extend(chunks)
        self._used = end
        self.placed_bytes += num_bytes
        return view

    def __repr__(self) -> str:
        return f"HostArena(placed={self.placed_bytes}, capacity={self.capacity})"


def restorable(home: torch.Tensor, processed: torch.Tensor, pin: bool) -> bool:
    """Can a processed weight go back into the host tensor it came from (an arena's slice
    or a pinned tensor)? Same layout, and pinned where vLLM would make a pinned copy."""
    return (
        home.shape == processed.shape
        and home.stride() == processed.stride()
        and home.dtype == processed.dtype
        and (home.is_pinned() or not pin)
    )


# Weight offload may overshoot its budget by the last parameter placed; this much
# extra address space is reserved (not committed) for it.
ARENA_SLACK_BYTES = 2 << 30


def make_arena(budget_bytes: int, pin: bool) -> HostArena | None:
    """An arena for weight offload when the budget is large enough to pass the gate."""
    if not should_register(budget_bytes, pin):
        return None
    return HostArena(budget_bytes + ARENA_SLACK_BYTES)


def make_unsized_arena(pin: bool) -> HostArena | None:
    """An arena for an offloader that learns its total only as it places parameters
    (prefetch offload): room for all of the host's RAM, committed as weights arrive."""
    if not pin:
        return None
    return HostArena(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
