from __future__ import annotations

from pathlib import Path

import pytest

from vllm_offload.hardware import GIB, GpuFacts, HostFacts
from vllm_offload.model import demo as demo_model


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_model.write(tmp_path_factory.mktemp("models") / "demo")


def make_host(gpu_gib: float | None = None, ram_gib: float = 128, shm_gib: float = 64) -> HostFacts:
    gpus = (
        ()
        if gpu_gib is None
        else (
            GpuFacts(
                index=0,
                name="test GPU",
                total_bytes=int(gpu_gib * GIB),
                free_bytes=int(gpu_gib * GIB),
            ),
        )
    )
    return HostFacts(
        gpus=gpus,
        ram_total_bytes=int(ram_gib * GIB),
        ram_available_bytes=int(ram_gib * GIB),
        shm_free_bytes=int(shm_gib * GIB),
        memlock_limit_bytes=None,
        cpu_count=16,
        gpu_source="declared" if gpus else "none",
    )


@pytest.fixture(scope="session")
def real_dir() -> Path:
    """The default model as `make install` converted it (converted here if it is absent)."""
    from vllm_offload.model import real as real_model

    return real_model.ensure_default()
