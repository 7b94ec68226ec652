"""The sleep-mode backend that keeps a sleeping engine's allocations in one host arena
(issue #31, vllm_ext/sleep.py). CPU-only here: the allocations are host buffers, the
GPU's copy and registration calls are memmove and a no-op, and a stand-in of vLLM's
CuMemAllocator releases (scribbles over) what it puts to sleep. The GPU run (benchmarks/
gpu/switch.py) shows the same tokens after a wake and the engine's host RAM."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

DEFERRABLE = ("weights", "kv_cache")  # vllm.device_allocator.DEFERRABLE_TAGS


@dataclass(kw_only=True)
class Allocation:
    handle: tuple[int, int]
    tag: str
    is_asleep: bool = False


@dataclass(kw_only=True)
class StandInAllocator:
    buffers: dict[str, Any] = field(default_factory=dict)
    pointer_to_data: dict[int, Allocation] = field(default_factory=dict)

    def allocate(self, tag: str, data: bytes) -> int:
        buffer = ctypes.create_string_buffer(data, len(data))
        self.buffers[f"{tag}{len(self.buffers)}"] = buffer
        ptr = ctypes.addressof(buffer)
        self.pointer_to_data[ptr] = Allocation(handle=(ptr, len(data)), tag=tag)
        return ptr

    def sleep(self, offload_tags: tuple[str, ...]) -> None:
        assert offload_tags == ()  # the arena keeps what is kept; vLLM backs up nothing
        for ptr, allocation in self.pointer_to_data.items():
            if allocation.is_asleep:  # vLLM's rule: passed over
                continue
            ctypes.memset(ptr, 0xEE, allocation.handle[1])  # released: its bytes are gone
            allocation.is_asleep = True

    def wake_up(self, tags: list[str] | None) -> None:
        for allocation in self.pointer_to_data.values():  # vLLM's rule: others always
            if not allocation.is_asleep:  # vLLM's rule: only what slept is mapped again
                continue
            if tags is None or allocation.tag in tags or allocation.tag not in DEFERRABLE:
                allocation.is_asleep = False


@pytest.fixture
def allocator(monkeypatch: pytest.MonkeyPatch) -> StandInAllocator:
    from vllm_offload.vllm_ext import sleep

    stand_in = StandInAllocator()
    monkeypatch.setattr(sleep.CuMemAllocator, "get_instance", staticmethod(lambda: stand_in))
    copies = SimpleNamespace(cudaMemcpy=lambda dst, src, n: ctypes.memmove(dst, src, n))
    monkeypatch.setattr(sleep, "libcudart", copies)
    registered: list[int] = []

    class NoCudart:
        def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
            registered.append(size)
            return 0

        def cudaHostUnregister(self, ptr: int) -> int:
            return 0

    monkeypatch.setattr(sleep.torch.cuda, "cudart", NoCudart)
    stand_in.buffers["registered"] = registered
    return stand_in


def read(ptr: int, size: int) -> bytes:
    return ctypes.string_at(ptr, size)


def test_a_level_1_sleep_keeps_weights_and_graphs_in_one_arena(
    allocator: StandInAllocator,
) -> None:
    from vllm_offload.vllm_ext.sleep import ArenaBackend

    weights = allocator.allocate("weights", b"W" * 5000)
    graphs = allocator.allocate("cudagraph", b"G" * 3000)
    kv = allocator.allocate("kv_cache", b"K" * 4000)
    backend = ArenaBackend()
    backend.suspend(level=1)
    assert allocator.buffers["registered"] == [8192]  # 8,000 bytes, page-rounded, once
    assert read(weights, 5000) == b"\xee" * 5000  # released
    backend.resume(["kv_cache"])  # vLLM may wake the KV first (and all but the weights)...
    assert read(weights, 5000) == b"\xee" * 5000 and read(graphs, 3000) == b"G" * 3000
    backend.resume(["weights"])  # ...and the weights after
    assert read(weights, 5000) == b"W" * 5000 and read(graphs, 3000) == b"G" * 3000
    assert read(kv, 4000) == b"\xee" * 4000  # the KV cache is discarded, as vLLM does
    backend.suspend(level=1)  # the next sleep reuses the arena
    backend.resume(None)
    assert read(weights, 5000) == b"W" * 5000
    assert allocator.buffers["registered"] == [8192]


def test_a_level_2_sleep_keeps_only_graphs_and_runtime(allocator: StandInAllocator) -> None:
    from vllm_offload.vllm_ext.sleep import ArenaBackend

    weights = allocator.allocate("weights", b"W" * 5000)
    runtime = allocator.allocate("runtime", b"R" * 100)
    backend = ArenaBackend()
    backend.suspend(level=2)
    backend.resume(None)
    assert read(runtime, 100) == b"R" * 100
    assert read(weights, 5000) == b"\xee" * 5000  # vLLM reloads weights after level 2


def test_weights_are_copied_out_once_while_they_stay_the_same(
    allocator: StandInAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload.vllm_ext import sleep

    weights = allocator.allocate("weights", b"W" * 5000)
    graphs = allocator.allocate("cudagraph", b"G" * 3000)
    copied_out: list[int] = []

    def memcpy(dst: int, src: int, n: int) -> None:
        if src in allocator.pointer_to_data:
            copied_out.append(src)
        ctypes.memmove(dst, src, n)

    monkeypatch.setattr(sleep, "libcudart", SimpleNamespace(cudaMemcpy=memcpy))
    backend = sleep.ArenaBackend()
    backend.suspend(level=1)
    assert copied_out == [weights, graphs]
    backend.resume(None)
    ctypes.memmove(graphs, b"g" * 3000, 3000)  # the graph pools change while serving
    backend.suspend(level=1)  # the weights' copy is still the weights: not copied again
    assert copied_out == [weights, graphs, graphs]
    backend.resume(None)
    assert read(weights, 5000) == b"W" * 5000 and read(graphs, 3000) == b"g" * 3000
    backend.suspend(level=2)  # weights read again at the wake: their copy is no longer kept
    backend.resume(None)
    ctypes.memmove(weights, b"V" * 5000, 5000)  # as vLLM loads them again
    copied_out.clear()
    backend.suspend(level=1)
    assert copied_out == [weights, graphs]
    backend.resume(None)
    assert read(weights, 5000) == b"V" * 5000


def test_a_larger_arena_gets_the_weights_again(allocator: StandInAllocator) -> None:
    """The pools grew while serving (a new CUDA-graph allocation): the arena is made again,
    larger, and the weights are copied into it, not assumed to be there."""
    from vllm_offload.vllm_ext.sleep import ArenaBackend

    weights = allocator.allocate("weights", b"W" * 5000)
    allocator.allocate("cudagraph", b"G" * 3000)
    backend = ArenaBackend()
    backend.suspend(level=1)
    backend.resume(None)
    more = allocator.allocate("cudagraph", b"H" * 4000)
    backend.suspend(level=1)
    assert allocator.buffers["registered"] == [8192, 12288]
    backend.resume(None)
    assert read(weights, 5000) == b"W" * 5000 and read(more, 4000) == b"H" * 4000


def test_the_last_weights_within_the_bytes_given_stay_on_the_gpu_asleep(
    allocator: StandInAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """residency.asleep_weights_on_gpu_gib (issue #58: a switch is the weights' copy): the
    last weight allocations whose sizes add up to no more than the bytes given stay mapped
    through the sleep, out of the arena, and a wake copies only the rest; vLLM's allocator
    sees them awake, so its wake leaves them be."""
    from vllm_offload.vllm_ext import sleep

    monkeypatch.setenv("VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES", "4500")
    first = allocator.allocate("weights", b"A" * 2000)
    middle = allocator.allocate("weights", b"B" * 3000)
    last = allocator.allocate("weights", b"C" * 1000)
    graphs = allocator.allocate("cudagraph", b"G" * 3000)
    backend = sleep.ArenaBackend()
    backend.suspend(level=1)
    assert allocator.buffers["registered"] == [8192]  # A and the graphs: 5,000 bytes
    assert read(middle, 3000) == b"B" * 3000 and read(last, 1000) == b"C" * 1000
    assert read(first, 2000) == b"\xee" * 2000 and read(graphs, 3000) == b"\xee" * 3000
    assert [allocator.pointer_to_data[p].is_asleep for p in (first, middle, last)] == [
        True,
        False,
        False,
    ]
    backend.resume(None)
    assert read(first, 2000) == b"A" * 2000 and read(graphs, 3000) == b"G" * 3000
    assert read(middle, 3000) == b"B" * 3000 and read(last, 1000) == b"C" * 1000
    monkeypatch.setenv("VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES", "all")
    with pytest.raises(ValueError, match="VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES must be"):
        sleep.ArenaBackend()


@pytest.fixture
def queued(allocator: StandInAllocator, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The layered wake's copies as queued (address, stream), made at once here, and
    each allocation mapped before its copy."""
    from vllm_offload.vllm_ext import sleep

    copies: list[tuple[int, int]] = []

    def memcpy_async(dst: int, src: int, n: int, kind: int, stream: int) -> int:
        assert kind == 4 and not allocator.pointer_to_data[dst].is_asleep
        copies.append((dst, stream))
        ctypes.memmove(dst, src, n)
        return 0

    monkeypatch.setattr(sleep, "_memcpy_async", lambda: memcpy_async)
    monkeypatch.setattr(sleep, "create_and_map", lambda handle: None)
    return copies


def test_a_layered_wake_holds_the_weights_for_their_copies_in_its_order(
    allocator: StandInAllocator, queued: list[tuple[int, int]]
) -> None:
    from vllm_offload.vllm_ext.sleep import ArenaBackend

    first = allocator.allocate("weights", b"A" * 5000)
    second = allocator.allocate("weights", b"B" * 3000)
    graphs = allocator.allocate("cudagraph", b"G" * 3000)
    backend = ArenaBackend()
    backend.suspend(level=1)
    backend.hold_weights = True
    backend.resume(None)
    assert read(graphs, 3000) == b"G" * 3000  # all else woken and copied as before
    assert list(backend.held) == [first, second]
    assert all(allocator.pointer_to_data[ptr].is_asleep for ptr in (first, second))
    assert read(first, 5000) == b"\xee" * 5000 and queued == []  # nothing mapped nor copied
    for address in (second, first):  # the order is the caller's
        backend.map_and_copy(address, stream=77)
    assert queued == [(second, 77), (first, 77)] and backend.held == {}
    assert read(first, 5000) == b"A" * 5000 and read(second, 3000) == b"B" * 3000
    backend.hold_weights = False
    backend.suspend(level=1)  # the weights' copy is still whole: the next wake as ever
    backend.resume(None)
    assert read(first, 5000) == b"A" * 5000 and queued == [(second, 77), (first, 77)]


def test_a_layered_wake_holds_only_the_weights_that_slept(
    allocator: StandInAllocator, queued: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm_offload.vllm_ext import sleep

    monkeypatch.setenv("VLLMOFFLOAD_SLEEP_WEIGHTS_ON_GPU_BYTES", "3000")
    first = allocator.allocate("weights", b"A" * 5000)
    second = allocator.allocate("weights", b"B" * 3000)
    backend = sleep.ArenaBackend()
    backend.suspend(level=1)
    backend.hold_weights = True
    backend.resume(None)
    assert list(backend.held) == [first]  # the second stayed on the GPU: nothing to copy
    backend.map_and_copy(first, stream=77)
    assert read(first, 5000) == b"A" * 5000 and read(second, 3000) == b"B" * 3000


@pytest.mark.parametrize("case", ["level 2", "copy released", "weights later"])
def test_weights_are_held_only_where_their_whole_copy_stays_in_the_arena(
    allocator: StandInAllocator,
    queued: list[tuple[int, int]],
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    from vllm_offload.vllm_ext import sleep

    if case == "copy released":
        monkeypatch.setenv(sleep.SLEEP_KEEP_COPY_ENV, "0")
    weights = allocator.allocate("weights", b"W" * 5000)
    backend = sleep.ArenaBackend()
    backend.suspend(level=2 if case == "level 2" else 1)
    backend.hold_weights = True
    backend.resume(["kv_cache"] if case == "weights later" else None)
    assert backend.held == {}
    if case == "copy released":
        assert read(weights, 5000) == b"W" * 5000  # copied whole, then the arena went back


def test_a_failed_layered_wake_copies_what_it_held_and_the_next_wake_is_whole(
    allocator: StandInAllocator, queued: list[tuple[int, int]]
) -> None:
    """What the worker does when its wake fails after the resume: every held allocation
    mapped and copied at once (no stream); a retried wake then finds nothing asleep and
    holds nothing; the next sleep keeps the weights' copy."""
    from vllm_offload.vllm_ext.sleep import ArenaBackend

    first = allocator.allocate("weights", b"A" * 5000)
    second = allocator.allocate("weights", b"B" * 3000)
    backend = ArenaBackend()
    backend.suspend(level=1)
    backend.hold_weights = True
    backend.resume(None)
    backend.map_and_copy(first, stream=5)  # then the error
    for address in list(backend.held):
        backend.map_and_copy(address, None)
    assert queued == [(first, 5)] and backend.held == {}
    assert read(second, 3000) == b"B" * 3000
    backend.resume(None)  # vLLM's executor retries a wake that raised
    assert backend.held == {} and read(first, 5000) == b"A" * 5000
    backend.hold_weights = False
    backend.suspend(level=1)
    backend.resume(None)
    assert read(first, 5000) == b"A" * 5000 and read(second, 3000) == b"B" * 3000


def test_the_async_copy_passes_64_bit_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    """cudaMemcpyAsync bound with its argument types (ctypes passes a bare int as a C
    int): here libc's memmove stands in, at a 64-bit address; its extra arguments (the
    kind, the stream) are ignored by the C calling convention."""
    from vllm_offload.vllm_ext import sleep

    libc_memmove = ctypes.CDLL(None)["memmove"]  # a fresh function object: no argtypes
    monkeypatch.setattr(
        sleep, "libcudart", SimpleNamespace(lib=SimpleNamespace(cudaMemcpyAsync=libc_memmove))
    )
    source, target = ctypes.create_string_buffer(b"S" * 64), ctypes.create_string_buffer(64)
    assert ctypes.addressof(target) > 1 << 32
    sleep._memcpy_async()(ctypes.addressof(target), ctypes.addressof(source), 64, 4, 1 << 40)
    assert target.raw == b"S" * 64
