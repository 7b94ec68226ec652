"""Patch 0002's helpers (vllm_ext.host_pinning) and vLLM's offloaders that call them: their
decisions, with injected registrars (no cudaHostRegister on a CPU host; the CUDA path is
measured on a GPU in docs/benchmarks.md)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.vllm_patches.conftest import collect_logs
from vllm_offload.vllm_ext import host_pinning
from vllm_offload.vllm_ext.knobs import PIN_REGISTER_MIN_ENV

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


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    host_pinning._warned = False
    with collect_logs(host_pinning.logger.name) as records:
        yield records


def test_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PIN_REGISTER_MIN_ENV, raising=False)
    assert host_pinning.gate_bytes() == 256 * MIB
    assert host_pinning.should_register(256 * MIB, pin=True)
    assert not host_pinning.should_register(256 * MIB - 1, pin=True)
    assert not host_pinning.should_register(4096 * MIB, pin=False)  # pinning off: never register
    monkeypatch.setenv(PIN_REGISTER_MIN_ENV, str(MIB))
    assert host_pinning.should_register(MIB, pin=True)
    monkeypatch.setenv(PIN_REGISTER_MIN_ENV, "256M")
    with pytest.raises(
        ValueError, match="VLLMOFFLOAD_PIN_REGISTER_MIN_BYTES must be a whole number"
    ):
        host_pinning.gate_bytes()


def test_arena_places_exact_page_aligned_slices() -> None:
    registrar = Recording()
    arena = host_pinning.HostArena(8 * MIB, registrar)
    a = torch.arange(1000, dtype=torch.float32)
    b = torch.ones(3 * MIB, dtype=torch.uint8)
    placed_a, placed_b = arena.place(a), arena.place(b)
    assert placed_a is not None and placed_b is not None
    assert torch.equal(placed_a, a) and torch.equal(placed_b, b)
    assert placed_b.data_ptr() - placed_a.data_ptr() == host_pinning.PAGE  # 4,000 bytes -> one page
    assert [n for _, n in registrar.registered] == [4000, 3 * MIB]  # exact sizes
    assert arena.placed_bytes == 4000 + 3 * MIB
    assert arena.place(torch.ones(6 * MIB, dtype=torch.uint8)) is None  # over capacity


def test_arena_registration_failure_returns_none_and_warns_once(
    monkeypatch: pytest.MonkeyPatch, warnings_logged: list[str]
) -> None:
    """All or none: a weight whose third chunk fails to register gives back the two
    registered and stays out of the arena, as does the next (the caller keeps torch's
    pinned copy); one warning names the fix."""
    monkeypatch.setattr(host_pinning, "CHUNK_BYTES", MIB // 4)
    registrar = Recording(fail_at=2)
    arena = host_pinning.HostArena(8 * MIB, registrar)
    assert arena.place(torch.ones(MIB, dtype=torch.uint8)) is None
    assert arena.place(torch.ones(MIB, dtype=torch.uint8)) is None
    assert arena.placed_bytes == 0
    assert registrar.unregistered == [ptr for ptr, _ in registrar.registered]  # both given back
    assert len(warnings_logged) == 1
    assert "4-6x slower than pinned" in warnings_logged[0] and "LimitMEMLOCK" in warnings_logged[0]


def test_arena_only_above_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PIN_REGISTER_MIN_ENV, str(64 * MIB))
    assert host_pinning.make_arena(32 * MIB, pin=True) is None
    assert host_pinning.make_arena(8 << 30, pin=False) is None
    arena = host_pinning.make_arena(64 * MIB, pin=True)
    assert isinstance(arena, host_pinning.HostArena)
    assert (
        arena.capacity == 64 * MIB + host_pinning.ARENA_SLACK_BYTES
    )  # address space, not committed


def test_unsized_arena_reserves_the_hosts_ram_without_committing_it() -> None:
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
    restorable = host_pinning.restorable
    home = torch.zeros(4, 8)
    assert restorable(home, torch.ones(4, 8), pin=False)
    assert not restorable(home, torch.ones(8, 4), pin=False)  # reshaped by processing
    assert not restorable(home, torch.ones(4, 8, dtype=torch.float16), pin=False)
    assert not restorable(home, torch.ones(8, 4).t(), pin=False)  # other strides
    assert not restorable(home, torch.ones(4, 8), pin=True)  # pageable, pinned wanted
