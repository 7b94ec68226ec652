"""The patched helper's decisions, with injected registrars (no cudaHostRegister on a CPU
host; the CUDA path is measured on a GPU in docs/benchmarks.md). The weight arena is in
both series; host_zeros (the CPU KV tier) only in 0.25.0's: 0.32.0 maps its tier from
/dev/shm and registers it itself."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.vllm_patches.conftest import collect_logs, patched_025

MIB = 1 << 20


class Recording:
    def __init__(self, fail_at: int | None = None) -> None:
        self.registered: list[tuple[int, int]] = []
        self.unregistered: list[int] = []
        self.fail_at = fail_at

    def register(self, ptr: int, num_bytes: int) -> bool:
        if self.fail_at is not None and len(self.registered) == self.fail_at:
            return False
        self.registered.append((ptr, num_bytes))
        return True

    def unregister(self, ptr: int) -> None:
        self.unregistered.append(ptr)


@pytest.fixture(params=["0.32.0", "0.25.0"])
def hp(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ModuleType]:
    """The patched host_pinning of each release."""
    if request.param == "0.32.0":
        from vllm.utils import host_pinning

        yield host_pinning
        return
    with patched_025(tmp_path, "vllm/utils/host_pinning.py") as module:
        yield module


@pytest.fixture
def hp025(tmp_path: Path) -> Iterator[ModuleType]:
    with patched_025(tmp_path, "vllm/utils/host_pinning.py") as module:
        yield module


@pytest.fixture
def warnings_logged(hp025: ModuleType) -> Iterator[list[str]]:
    hp025._warned = False
    with collect_logs(hp025.logger.name) as records:
        yield records


def test_gate(hp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hp.GATE_ENV, raising=False)
    assert hp.gate_bytes() == 256 * MIB
    assert hp.should_register(256 * MIB, pin=True)
    assert not hp.should_register(256 * MIB - 1, pin=True)
    assert not hp.should_register(4096 * MIB, pin=False)  # pinning off: never register
    monkeypatch.setenv(hp.GATE_ENV, str(MIB))
    assert hp.should_register(MIB, pin=True)
    monkeypatch.setenv(hp.GATE_ENV, "256M")
    with pytest.raises(ValueError, match="VLLM_PIN_REGISTER_MIN_BYTES must be a whole number"):
        hp.gate_bytes()


def test_large_buffer_is_pageable_and_registered_in_row_aligned_chunks(
    hp025: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hp025, "CHUNK_BYTES", 10 * MIB)
    registrar = Recording()
    row = 3 * MIB
    tensor = hp025.host_zeros((12, row), torch.int8, pin=True, row_bytes=row,
                           registrar=registrar, gate=MIB)  # fmt: skip
    assert tensor.shape == (12, row) and not tensor.any()
    sizes = [n for _, n in registrar.registered]
    assert sizes == [9 * MIB, 9 * MIB, 9 * MIB, 9 * MIB]  # whole rows per chunk
    assert registrar.registered[0][0] == tensor.data_ptr()
    del tensor
    gc.collect()
    assert len(registrar.unregistered) == 4  # released with the tensor


def test_small_buffer_keeps_torch_allocator(hp025: ModuleType) -> None:
    registrar = Recording()
    tensor = hp025.host_zeros((4, MIB), torch.int8, pin=False, registrar=registrar, gate=MIB)
    assert registrar.registered == []
    assert tensor.shape == (4, MIB)


def test_failed_registration_falls_back_to_pageable_with_one_warning(
    hp025: ModuleType, monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    monkeypatch.setattr(hp025, "CHUNK_BYTES", 4 * MIB)
    registrar = Recording(fail_at=1)
    first = hp025.host_zeros((16, MIB), torch.int8, pin=True, registrar=registrar, gate=MIB,
                          what="the CPU KV tier")  # fmt: skip
    second = hp025.host_zeros((16, MIB), torch.int8, pin=True, registrar=Recording(fail_at=0),
                           gate=MIB)  # fmt: skip
    assert first.shape == second.shape == (16, MIB)
    assert registrar.unregistered == [registrar.registered[0][0]]  # all or none
    assert len(warnings_logged) == 1
    assert "the CPU KV tier" in warnings_logged[0]
    assert "4-6x slower than pinned" in warnings_logged[0]
    assert "LimitMEMLOCK" in warnings_logged[0]


def test_arena_places_exact_page_aligned_slices(hp: ModuleType) -> None:
    registrar = Recording()
    arena = hp.HostArena(8 * MIB, registrar)
    a = torch.arange(1000, dtype=torch.float32)
    b = torch.ones(3 * MIB, dtype=torch.uint8)
    placed_a, placed_b = arena.place(a), arena.place(b)
    assert placed_a is not None and placed_b is not None
    assert torch.equal(placed_a, a) and torch.equal(placed_b, b)
    assert placed_b.data_ptr() - placed_a.data_ptr() == hp.PAGE  # 4,000 bytes -> one page
    assert [n for _, n in registrar.registered] == [4000, 3 * MIB]  # exact sizes
    assert arena.placed_bytes == 4000 + 3 * MIB
    assert arena.place(torch.ones(6 * MIB, dtype=torch.uint8)) is None  # over capacity


def test_arena_registration_failure_returns_none(hp: ModuleType) -> None:
    arena = hp.HostArena(8 * MIB, Recording(fail_at=0))
    assert arena.place(torch.ones(MIB, dtype=torch.uint8)) is None
    assert arena.placed_bytes == 0


def test_arena_only_above_gate(hp: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hp.GATE_ENV, str(64 * MIB))
    assert hp.make_arena(32 * MIB, pin=True) is None
    assert hp.make_arena(8 << 30, pin=False) is None
    arena = hp.make_arena(64 * MIB, pin=True)
    assert isinstance(arena, hp.HostArena)
    assert arena.capacity == 64 * MIB + hp.ARENA_SLACK_BYTES  # address space, not committed


def test_unsized_arena_reserves_the_hosts_ram_without_committing_it() -> None:
    from vllm.utils import host_pinning

    assert host_pinning.make_unsized_arena(pin=False) is None
    before = _rss_bytes()
    arena = host_pinning.make_unsized_arena(pin=True)
    assert arena is not None
    assert arena.capacity == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert _rss_bytes() - before < 64 * MIB  # address space only


def _rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_prefetch_offloader_keeps_each_weight_in_the_arena() -> None:
    """0.32.0 unpatched gave every prefetch-offloaded parameter its own torch-pinned
    tensor (power-of-two rounded); patched, contiguous ones go to the exact-size arena and
    strided ones keep a tensor of their own layout."""
    from vllm.model_executor.offloader.prefetch import _CpuParamOffloader
    from vllm.utils import host_pinning

    registrar = Recording()
    arena = host_pinning.HostArena(64 * MIB, registrar)
    module = torch.nn.Module()
    module.weight = torch.nn.Parameter(torch.randn(300, 700), requires_grad=False)
    module.strided = torch.nn.Parameter(torch.randn(64, 32).t(), requires_grad=False)
    expected = module.weight.data.clone()

    weight = _CpuParamOffloader(module, "weight", arena=arena)
    strided = _CpuParamOffloader(module, "strided", arena=arena)

    storage = weight._cpu_storage
    assert storage is not None and module.weight.data.data_ptr() == storage.data_ptr()
    assert torch.equal(storage, expected)
    assert arena.placed_bytes == weight.offloaded_bytes == 300 * 700 * 4
    assert registrar.registered == [(storage.data_ptr(), 300 * 700 * 4)]
    assert strided._cpu_storage is not None and strided._cpu_storage.stride() == (1, 32)


def test_processed_weight_goes_back_into_its_own_host_tensor() -> None:
    """device_loading_context copied each processed weight into a new pinned tensor,
    doubling prefetch offload's host RAM; patched, it copies back into the tensor it came
    from when the layout is the same and that tensor is pinned where a pinned one is
    wanted. (The copy itself needs a GPU: measured in docs/benchmarks.md.)"""
    from vllm.model_executor.model_loader.utils import _restorable

    home = torch.zeros(4, 8)
    assert _restorable(home, torch.ones(4, 8), pin=False)
    assert not _restorable(home, torch.ones(8, 4), pin=False)  # reshaped by processing
    assert not _restorable(home, torch.ones(4, 8, dtype=torch.float16), pin=False)
    assert not _restorable(home, torch.ones(8, 4).t(), pin=False)  # other strides
    assert not _restorable(home, torch.ones(4, 8), pin=True)  # pageable, pinned wanted
