"""Patch 0004: vLLM 0.32.0 pre-faults its CPU KV tier's /dev/shm region from one thread
(17 s of a 40 GiB tier's 18.7 s set-up on an H200 host); patched, from POPULATE_THREADS.
Here: the real SharedOffloadRegion on a small region, with libc's madvise wrapped to
record which spans each thread populated."""

from __future__ import annotations

import ctypes
import mmap
import threading
import uuid

import pytest
from vllm.v1.kv_offload.cpu import shared_offload_region as sor

MIB = 1 << 20


class RecordingLibc:
    """libc whose madvise records (address, length, thread) and then runs."""

    def __init__(self) -> None:
        self.real = sor._libc
        self.calls: list[tuple[int, int, int]] = []
        self.lock = threading.Lock()
        self.started = threading.Barrier(2, timeout=30)

    def madvise(self, address: int, length: int, advice: int) -> int:
        with self.lock:
            self.calls.append((address, length, threading.get_ident()))
            first_two = len(self.calls) <= 2
        if first_two:
            self.started.wait()  # two spans in flight at once, or this times out
        return int(self.real.madvise(address, length, advice))

    def spans(self, region: sor.SharedOffloadRegion) -> list[tuple[int, int]]:
        base = address_of(region)
        return sorted((address - base, length) for address, length, _ in self.calls)


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> RecordingLibc:
    recording = RecordingLibc()
    monkeypatch.setattr(sor, "_libc", recording)
    return recording


def address_of(region: sor.SharedOffloadRegion) -> int:
    assert region.mmap_obj is not None
    anchor = ctypes.c_char.from_buffer(region.mmap_obj)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def resident_pages(region: sor.SharedOffloadRegion) -> int:
    assert region.mmap_obj is not None
    libc = ctypes.CDLL(None, use_errno=True)
    pages = region.total_size_bytes // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(address_of(region), region.total_size_bytes, vec) == 0
    return sum(byte & 1 for byte in vec)


def test_workers_pages_are_populated_from_several_threads(libc: RecordingLibc) -> None:
    chunks, page_per_worker = 16, 2 * MIB
    region = sor.SharedOffloadRegion(
        engine_id=f"test-{uuid.uuid4()}",
        num_chunks=chunks,
        rank=0,
        kv_bytes_per_chunk=2 * page_per_worker,  # two workers; this is rank 0
        cpu_page_size=page_per_worker,
        barrier=lambda: None,
    )
    try:
        spans = libc.spans(region)
        row = 2 * page_per_worker
        assert spans == [(chunk * row, page_per_worker) for chunk in range(chunks)]
        assert len({thread for _, _, thread in libc.calls}) > 1
        assert resident_pages(region) == chunks * page_per_worker // mmap.PAGESIZE
    finally:
        region.cleanup()


def test_whole_region_is_populated_in_spans(libc: RecordingLibc) -> None:
    region = sor.SharedOffloadRegion(
        engine_id=f"test-{uuid.uuid4()}",
        num_chunks=5,
        rank=None,
        kv_bytes_per_chunk=20 * MIB,
        cpu_page_size=20 * MIB,
    )
    try:
        spans = libc.spans(region)
        assert sor.POPULATE_SPAN_BYTES == 32 * MIB
        assert spans == [
            (0, 32 * MIB),
            (32 * MIB, 32 * MIB),
            (64 * MIB, 32 * MIB),
            (96 * MIB, 4 * MIB),
        ]
        assert resident_pages(region) == 100 * MIB // mmap.PAGESIZE
    finally:
        region.cleanup()
