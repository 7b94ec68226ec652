from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.shapes import LLAMA3_8B, QWEN3_30B_A3B, SHAPES, write_shape
from vllm_offload.config import DeploymentConfig, with_overrides
from vllm_offload.hardware import GIB
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import PlanError, kv_bytes_per_token, make_plan, render
from vllm_offload.plan.gpu import prefetch_layout

MIB = 1 << 20


def config_for(model_dir: Path, **overrides: Any) -> DeploymentConfig:
    return with_overrides(DeploymentConfig(), {"model.path": str(model_dir), **overrides})


def vllm_bytes_per_block(model_dir: Path, block_size: int, tp: int) -> int:
    """All layers' KV bytes per block on one rank, as vLLM's own KVCacheSpec computes them."""
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True)
    pc = ParallelConfig(tensor_parallel_size=tp)
    heads, head, layers = mc.get_num_kv_heads(pc), mc.get_head_size(), mc.get_num_layers(pc)
    spec: FullAttentionSpec
    if mc.use_mla:
        spec = MLAAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=head, dtype=mc.dtype
        )
    elif window := mc.get_sliding_window():
        spec = SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=heads,
            head_size=head,
            dtype=mc.dtype,
            sliding_window=window,
        )
    else:
        spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=heads, head_size=head, dtype=mc.dtype
        )
    return int(layers * spec.page_size_bytes)


@pytest.fixture(scope="module")
def shape_dirs(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    dirs = {name: write_shape(root / name, cfg) for name, cfg in SHAPES.items()}
    return {"demo": demo_dir, **dirs}


@pytest.mark.parametrize(
    ("shape", "tp"),
    [
        ("demo", 1),
        ("llama3-8b", 1),
        ("llama3-8b", 2),
        ("llama3-8b", 16),
        ("qwen3-30b-a3b", 1),
        ("qwen3-30b-a3b", 2),
        ("gemma3-4b", 1),
        ("deepseek-v2-lite", 1),
        ("deepseek-v2-lite", 2),
    ],
)
def test_kv_bytes_match_vllm_spec(
    shape_dirs: dict[str, Path], shape: str, tp: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    block = 16
    facts = model_facts.read(shape_dirs[shape])
    ours = kv_bytes_per_token(facts, 2, tp) * block
    assert ours == vllm_bytes_per_block(shape_dirs[shape], block, tp)
    plan = make_plan(
        config_for(
            shape_dirs[shape],
            **{"parallel.tensor_parallel_size": tp, "kv_offload.block_size": block},
        ),
        facts,
        make_host(141, ram_gib=1024),
        "cuda",
    )
    assert plan.kv.bytes_per_block == ours
    assert plan.kv.bytes_per_token * block == ours


def test_qwen3_seed_numbers(tmp_path: Path) -> None:
    # seed: 48 layers, 4 KV heads, 128 dims -> 50,000 blocks of 16 ~ 78 GB
    facts = model_facts.read(write_shape(tmp_path, QWEN3_30B_A3B))
    per_block = kv_bytes_per_token(facts, 2) * 16
    assert per_block == 48 * 2 * 4 * 128 * 2 * 16
    assert 50_000 * per_block == pytest.approx(78.6e9, rel=0.001)


def test_llama_on_24gb(tmp_path: Path) -> None:
    model = write_shape(tmp_path, LLAMA3_8B)
    plan = make_plan(config_for(model), model_facts.read(model), make_host(24, ram_gib=128), "cuda")
    assert plan.kv.backend == "native"
    assert plan.weights.offloaded_bytes == 0
    assert plan.kv.bytes_per_token == 131072  # 32 layers x 2 x 8 x 128 x 2 bytes
    # 21.6 GiB budget - 14.96 GiB weights - ~1.5 GiB working memory
    assert 3.5 * GIB < plan.gpu.kv_pool_bytes < 5 * GIB  # CUDA graphs counted (#43)
    assert plan.length.max_model_len == 8192  # the model's limit; the pool holds more
    assert plan.length.longest_request_tokens > 8192
    # vLLM maps the tier from /dev/shm, by default half the RAM: that bounds it here, less
    # what vLLM uses of /dev/shm itself.
    assert plan.cpu_tier.bytes == 63 * GIB
    # with the native tier on plain attention: 128-token blocks, 256-token CPU chunks
    assert (plan.kv.block_tokens, plan.kv.chunk_tokens) == (128, 256)
    assert plan.cpu_tier.tokens == plan.cpu_tier.bytes // plan.kv.bytes_per_block * 128
    big_shm = make_plan(
        config_for(model), model_facts.read(model), make_host(24, ram_gib=128, shm_gib=128), "cuda"
    )
    # RAM less the 10 % reserve and ~3.75 GiB for vLLM's own processes, whole GiB
    assert big_shm.cpu_tier.bytes == 111 * GIB
    text = render(plan)
    assert "longest request" in text and "GiB" in text and "tokens" in text


def test_max_model_len_beyond_the_pool_is_refused(tmp_path: Path) -> None:
    model = write_shape(tmp_path, dict(LLAMA3_8B, max_position_embeddings=131072))
    facts = model_facts.read(model)
    config = config_for(
        model,
        **{
            "gpu.kv_cache_memory_bytes": 2 * GIB,
            "model.max_model_len": 65536,
            "kv_offload.block_size": 16,
        },
    )
    with pytest.raises(PlanError) as info:
        make_plan(config, facts, make_host(24), "cuda")
    assert info.value.field == "model.max_model_len"
    # 2 GiB / 2 MiB per block = 1024 blocks, one held back -> 1023 x 16 tokens
    assert "holds 16368 tokens" in info.value.message
    assert "CPU tier does not extend one request" in info.value.message
    auto = make_plan(
        config_for(model, **{"gpu.kv_cache_memory_bytes": 2 * GIB, "kv_offload.block_size": 16}),
        facts,
        make_host(24),
        "cuda",
    )
    assert auto.length.max_model_len == 16368


def test_the_host_extension_lengthens_one_request_and_says_what_it_costs(
    tmp_path: Path,
) -> None:
    """Issue #22's case: a 2 GiB GPU pool (16k tokens of Llama-3-8B) and 8 GiB of host RAM
    after it hold a 64k-token request; the planner says how fast it can decode."""
    model = write_shape(tmp_path, dict(LLAMA3_8B, max_position_embeddings=131072))
    facts = model_facts.read(model)
    capped = {"gpu.kv_cache_memory_bytes": 2 * GIB, "kv_offload.block_size": 16}
    extended = {**capped, "kv_offload.host_extension_gib": 8.0}
    with pytest.raises(PlanError) as info:
        make_plan(
            config_for(model, **capped, **{"model.max_model_len": 65536}),
            facts,
            make_host(24),
            "cuda",
        )
    assert "give kv_offload.host_extension_gib the rest" in info.value.message
    shared = {"model.max_model_len": 65536, "kv_offload.spilled_step_share": 0.25}
    plan = make_plan(config_for(model, **extended, **shared), facts, make_host(24), "cuda")
    assert (plan.extension.bytes, plan.extension.tokens) == (8 * GIB, 65536)
    # the staging scratch (one layer of the 65,536-token request, 64 KiB a block and layer:
    # 256 MiB) comes out of the 2 GiB: 896 GPU blocks (whole 32-block granules) are left
    scratch = plan.extension.staging_scratch_bytes
    assert scratch == 256 * MIB
    assert plan.gpu.kv_pool_bytes == 2 * GIB - scratch and plan.gpu.kv_pool_blocks == 896
    assert plan.length.longest_request_tokens == 895 * 16 + 65536
    # 64k tokens = 8 GiB of KV, half the 896 GPU blocks held (the others' room, issue
    # #42): the rest read every decode step
    assert plan.extension.spilled_decode_steps_per_s_ceiling == round(
        plan.costs.h2d_bytes_per_s / (8 * GIB - 448 * 2 * MIB), 2
    )
    assert any(
        "host extension: 8.00 GiB per GPU = 65,536 tokens" in d
        and "beside other requests, whose steps it joins in at most 25% of the time" in d
        for d in plan.notes.decisions
    )
    # share 1: it keeps all 896 GPU blocks, the others wait
    alone = make_plan(
        config_for(
            model,
            **extended,
            **{"model.max_model_len": 65536, "kv_offload.spilled_step_share": 1.0},
        ),
        facts,
        make_host(24),
        "cuda",
    )
    assert alone.extension.spilled_decode_steps_per_s_ceiling == round(
        alone.costs.h2d_bytes_per_s / (8 * GIB - 896 * 2 * MIB), 2
    )
    assert "8.00 GiB = 65,536 tokens per GPU (continues the pool" in render(plan)
    assert "(GPU pool + host extension)" in render(plan)
    auto = make_plan(config_for(model, **extended), facts, make_host(24), "cuda")
    # the longest request the pool could hold (81,904 tokens) sizes the scratch: 320 MiB
    assert auto.length.max_model_len == (864 - 1) * 16 + 65536
    # the RAM it takes is the CPU tier's no more
    assert auto.host_ram.tier_room_ram_bytes == plan.host_ram.tier_room_ram_bytes
    plain = make_plan(config_for(model, **capped), facts, make_host(24), "cuda")
    assert plain.host_ram.tier_room_ram_bytes - auto.host_ram.tier_room_ram_bytes == 8 * GIB


def test_the_staging_scratch_holds_one_layer_of_the_longest_request_and_the_pool_gives_it(
    tmp_path: Path, demo_dir: Path
) -> None:
    """Issue #41: with a host extension, the GPU scratch of staged prefill (one layer of a
    max_model_len request, shared by all layers) comes out of the GPU pool and the plan
    shows it; none without an extension, with kv_offload.staged_prefill off, or when
    max_model_len fits the GPU part; at most a quarter of the pool."""
    model = write_shape(tmp_path, dict(LLAMA3_8B, max_position_embeddings=131072))
    facts = model_facts.read(model)
    pool = {"gpu.kv_cache_memory_bytes": 2 * GIB, "kv_offload.block_size": 16}
    extended = {**pool, "kv_offload.host_extension_gib": 8.0, "model.max_model_len": 65536}
    plan = make_plan(config_for(model, **extended), facts, make_host(24), "cuda")
    page = 16 * 4096  # one 16-token block of one layer: K and V, 8 heads x 128, bf16
    ext = plan.extension
    assert (ext.staging_scratch_tokens, ext.staging_scratch_bytes) == (65536, 4096 * page)
    assert plan.gpu.kv_pool_bytes == 2 * GIB - ext.staging_scratch_bytes
    assert "staging_scratch_bytes" in plan.to_json()
    assert (
        f"  staging scratch     {ext.staging_scratch_bytes / GIB:.2f} GiB of GPU memory, "
        "taken from the pool"
    ) in render(plan)
    assert any("staging scratch:" in d for d in plan.notes.decisions)
    plain = make_plan(config_for(model, **pool), facts, make_host(24), "cuda")
    short = make_plan(
        config_for(model, **{**extended, "model.max_model_len": 12000}),
        facts,
        make_host(24),
        "cuda",
    )
    off = make_plan(
        config_for(model, **extended, **{"kv_offload.staged_prefill": False}),
        facts,
        make_host(24),
        "cuda",
    )
    wide = make_plan(
        config_for(model, **{**extended, "model.max_model_len": 32768, "model.dtype": "float32"}),
        facts,
        make_host(48),
        "cuda",
    )
    assert any("float32 KV cache" in d for d in wide.notes.decisions)
    for none in (plain, short, off, wide):
        assert none.extension.staging_scratch_bytes == 0 and none.gpu.kv_pool_bytes == 2 * GIB
        assert "  staging scratch" not in render(none)
    # a pool that cannot give the whole request's scratch gives a quarter of itself: 64 MiB
    # = 1,024 blocks of 16 tokens; a longer spilled request reads in place
    small = {**extended, "gpu.kv_cache_memory_bytes": 256 * MIB}
    capped = make_plan(config_for(model, **small), facts, make_host(24), "cuda")
    assert (capped.extension.staging_scratch_bytes, capped.extension.staging_scratch_tokens) == (
        64 * MIB,
        16384,
    )
    assert any("longer than 16,384 tokens reads its host" in d for d in capped.notes.decisions)
    # two layers (the demo model): a quarter of an 8 MiB pool, 2,048 tokens of one layer
    demo = make_plan(
        config_for(
            demo_dir,
            **{
                "gpu.kv_cache_memory_bytes": 8 * MIB,
                "kv_offload.block_size": 16,
                "kv_offload.host_extension_gib": 8 / 1024,
            },
        ),
        model_facts.read(demo_dir),
        make_host(24),
        "cuda",
    )
    assert demo.extension.staging_scratch_bytes == 2 * MIB and demo.gpu.kv_pool_bytes == 6 * MIB


def test_an_extended_pool_whose_gpu_part_is_no_mapping_step_is_refused(tmp_path: Path) -> None:
    """Patch 0006 maps each layer's part of the pool in 2 MiB granules and refuses to start
    with no whole step of them on the GPU. A pool set at one step (32 blocks of 16 tokens of
    the 8B shape: 64 MiB) less the staging scratch it gives is less than one: refused
    before the server, naming the pool and how much more it needs (the plan showed "0
    blocks = 0 tokens" and vLLM refused)."""
    model = write_shape(tmp_path, dict(LLAMA3_8B, max_position_embeddings=131072))
    facts = model_facts.read(model)
    extended = {
        "kv_offload.block_size": 16,
        "kv_offload.host_extension_gib": 1.0,
        "model.max_model_len": 4096,  # a scratch of 4,096 tokens of one layer: 16 MiB
    }
    with pytest.raises(PlanError) as info:
        make_plan(
            config_for(model, **extended, **{"gpu.kv_cache_memory_bytes": 64 * MIB}),
            facts,
            make_host(24),
            "cuda",
        )
    assert info.value.field == "gpu.kv_cache_memory_bytes"
    assert "holds no 32 whole blocks (512 tokens" in info.value.message
    assert "at least 16,777,216 bytes more" in info.value.message
    for fits in (
        {"gpu.kv_cache_memory_bytes": 80 * MIB},
        {"gpu.kv_cache_memory_bytes": 64 * MIB, "kv_offload.staged_prefill": False},
    ):
        plan = make_plan(config_for(model, **extended, **fits), facts, make_host(24), "cuda")
        assert plan.gpu.kv_pool_blocks == 32


def test_the_host_extension_is_refused_where_it_cannot_be(tmp_path: Path) -> None:
    model = write_shape(tmp_path, dict(LLAMA3_8B, max_position_embeddings=131072))
    facts = model_facts.read(model)
    too_big = config_for(model, **{"kv_offload.host_extension_gib": 200.0})
    with pytest.raises(PlanError) as info:
        make_plan(too_big, facts, make_host(24, ram_gib=128), "cuda")
    assert info.value.field == "kv_offload.host_extension_gib"
    assert "set it <= 111" in info.value.message  # 128 GiB - 12.8 reserve - 4 for vLLM
    on_cpu = make_plan(
        config_for(model, **{"kv_offload.host_extension_gib": 1.0, "kv_offload.backend": "none"}),
        facts,
        make_host(None),
        "cpu",
    )
    assert [p["field"] for p in on_cpu.notes.problems] == ["kv_offload.host_extension_gib"]
    sliding = write_shape(
        tmp_path / "s", dict(LLAMA3_8B, model_type="mistral", sliding_window=4096)
    )
    with pytest.raises(PlanError, match=r"all full attention; .* also has sliding layers"):
        make_plan(
            config_for(sliding, **{"kv_offload.host_extension_gib": 1.0}),
            model_facts.read(sliding),
            make_host(24),
            "cuda",
        )


def test_weights_that_do_not_fit_without_offload(tmp_path: Path) -> None:
    model = write_shape(tmp_path, QWEN3_30B_A3B)
    facts = model_facts.read(model)
    with pytest.raises(PlanError) as info:
        make_plan(config_for(model), facts, make_host(24), "cuda")
    assert info.value.field == "weights_offload.cpu_gib"
    assert "do not fit" in info.value.message
    plan = make_plan(
        config_for(model, **{"weights_offload.cpu_gib": "auto"}),
        facts,
        make_host(24, ram_gib=128),
        "cuda",
    )
    assert plan.weights.offloaded_bytes > 35 * GIB
    assert plan.gpu.kv_pool_bytes > 0
    assert plan.cpu_tier.bytes <= (128 - 12.8) * GIB - plan.weights.offloaded_bytes


def test_cpu_platform_honours_vllm_cpu_kvcache_space(demo_dir: Path) -> None:
    facts = model_facts.read(demo_dir)
    plan = make_plan(
        config_for(demo_dir), facts, make_host(None), "cpu", env={"VLLM_CPU_KVCACHE_SPACE": "1"}
    )
    assert plan.gpu.kv_pool_bytes == GIB
    assert plan.kv.block_tokens == 128
    assert plan.gpu.kv_pool_tokens == GIB // 2048
    assert plan.kv.backend == "none" and plan.cpu_tier.bytes == 0


def test_small_tier_and_small_pool_warn(tmp_path: Path) -> None:
    model = write_shape(tmp_path, LLAMA3_8B)
    config = config_for(model, **{"kv_offload.cpu_tier_gib": 0.5, "gpu.kv_cache_memory_bytes": GIB})
    plan = make_plan(config, model_facts.read(model), make_host(24), "cuda")
    assert any("smaller than one full-length request" in w for w in plan.notes.warnings)
    assert any("long requests will queue" in w for w in plan.notes.warnings)


def test_plan_json_is_stable(demo_dir: Path) -> None:
    plan = make_plan(config_for(demo_dir), model_facts.read(demo_dir), make_host(24), "cuda")
    assert sorted(plan.to_json()) == sorted(
        [
            "platform",
            "model_path",
            "architecture",
            "kv_offload_backend",
            "kv_offload_backend_reason",
            "block_size_tokens",
            "cpu_chunk_tokens",
            "kv_cache_dtype",
            "kv_dtype_bytes",
            "kv_bytes_per_token",
            "kv_bytes_per_block",
            "weight_bytes",
            "weight_bytes_source",
            "weights_gpu_bytes",
            "weights_offloaded_bytes",
            "prefetch_group_size",
            "prefetch_num_in_group",
            "weights_offloaded_layers",
            "weight_components",
            "gpu_total_bytes",
            "gpu_budget_bytes",
            "gpu_kv_pool_bytes",
            "gpu_kv_pool_blocks",
            "gpu_kv_pool_tokens",
            "prefill_chunk_tokens",
            "prefill_chunk_source",
            "vllm_default_chunk_tokens",
            "working_memory_measured_chunk_tokens",
            "prefill_chunk_activation_bytes",
            "prefill_chunk_added_bytes",
            "vision_encoder_profile_tokens",
            "vision_encoder_profile_bytes",
            "vision_largest_image_tokens",
            "vision_max_pixels_read",
            "longest_request_tokens",
            "model_max_tokens",
            "max_model_len",
            "max_model_len_source",
            "max_concurrency_at_full_length",
            "min_concurrent_requests",
            "h2d_bytes_per_s",
            "h2d_source",
            "decode_steps_per_s_ceiling",
            "decisions",
            "host_extension_bytes",
            "host_extension_tokens",
            "spilled_decode_steps_per_s_ceiling",
            "staging_scratch_bytes",
            "staging_scratch_tokens",
            "cpu_tier_bytes",
            "cpu_tier_blocks",
            "cpu_tier_tokens",
            "sync_load_budget_bytes",
            "ram_total_bytes",
            "ram_available_bytes",
            "ram_reserve_bytes",
            "shm_free_bytes",
            "server_ram_bytes",
            "cpu_tier_room_ram_bytes",
            "cpu_tier_room_shm_bytes",
            "tensor_parallel_size",
            "reproducible",
            "vllm_release",
            "disk_tier_path",
            "disk_tier_root",
            "disk_tier_bytes",
            "disk_tier_tokens",
            "disk_reserve_bytes",
            "warnings",
            "unplanned",
            "problems",
        ]
    )


def test_fp8_kv_cache_halves_the_bytes(tmp_path: Path) -> None:
    model = write_shape(tmp_path, LLAMA3_8B)
    facts = model_facts.read(model)
    auto = make_plan(config_for(model), facts, make_host(24), "cuda")
    fp8 = make_plan(
        config_for(model, **{"model.kv_cache_dtype": "fp8"}), facts, make_host(24), "cuda"
    )
    assert fp8.kv.bytes_per_token * 2 == auto.kv.bytes_per_token == 131072
    assert fp8.gpu.kv_pool_blocks == pytest.approx(2 * auto.gpu.kv_pool_blocks, abs=1)


def test_fp8_matches_vllm_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    facts = model_facts.read(write_shape(tmp_path, LLAMA3_8B))
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.float8_e4m3fn
    )
    assert kv_bytes_per_token(facts, 1) * 16 == 32 * spec.page_size_bytes


@pytest.mark.parametrize(
    ("layers", "needed", "layout"),
    [
        (32, 20, (6, 4, 20)),
        (32, 16, (2, 1, 16)),
        (32, 1, (17, 1, 1)),
        (32, 32, (1, 1, 32)),
        (32, 18, (5, 3, 18)),
        (28, 14, (2, 1, 14)),
    ],
)
def test_prefetch_layout_covers_the_layers_needed(
    layers: int, needed: int, layout: tuple[int, int, int]
) -> None:
    group, in_group, count = prefetch_layout(layers, needed)
    assert (group, in_group, count) == layout
    # vLLM offloads layer i when i % group >= group - in_group
    assert count == sum(1 for i in range(layers) if i % group >= group - in_group) >= needed


def test_prefetch_backend_offloads_whole_layers(tmp_path: Path) -> None:
    model = write_shape(tmp_path, LLAMA3_8B)
    facts = model_facts.read(model)
    uva = make_plan(
        config_for(model, **{"weights_offload.cpu_gib": 8.0}), facts, make_host(24), "cuda"
    )
    prefetch = make_plan(
        config_for(
            model, **{"weights_offload.cpu_gib": 8.0, "weights_offload.backend": "prefetch"}
        ),
        facts,
        make_host(24),
        "cuda",
    )
    assert uva.weights.offloaded_bytes == 8 * GIB and uva.weights.offloaded_layers == 0
    # 8 GiB of ~0.41 GiB decoder layers: 20 layers, the last 4 of every 6
    assert (
        prefetch.weights.prefetch_group_size,
        prefetch.weights.prefetch_num_in_group,
    ) == (6, 4)
    assert prefetch.weights.offloaded_layers == 20
    assert 8 * GIB <= prefetch.weights.offloaded_bytes < 8.5 * GIB
    # one layer's GPU buffer for the copy in flight comes out of the pool
    layer = prefetch.weights.offloaded_bytes // 20
    freed = prefetch.weights.offloaded_bytes - uva.weights.offloaded_bytes
    assert prefetch.gpu.kv_pool_bytes - uva.gpu.kv_pool_bytes == pytest.approx(
        freed - layer, abs=1 << 20
    )
    assert "20 layers: the last 4 of every 6, prefetched" in render(prefetch)


def test_block_size_auto_follows_the_cpu_tier(tmp_path: Path, demo_dir: Path) -> None:
    model = write_shape(tmp_path, LLAMA3_8B)
    facts = model_facts.read(model)
    native = make_plan(config_for(model), facts, make_host(24), "cuda")
    assert (native.kv.block_tokens, native.kv.chunk_tokens) == (128, 256)
    none = make_plan(
        config_for(model, **{"kv_offload.backend": "none"}), facts, make_host(24), "cuda"
    )
    assert (none.kv.block_tokens, none.kv.chunk_tokens) == (16, 16)
    pinned = make_plan(
        config_for(model, **{"kv_offload.block_size": 32}), facts, make_host(24), "cuda"
    )
    assert (pinned.kv.block_tokens, pinned.kv.chunk_tokens) == (32, 256)
    mla_dir = write_shape(tmp_path / "mla", SHAPES["deepseek-v2-lite"])
    mla = make_plan(config_for(mla_dir), model_facts.read(mla_dir), make_host(80), "cuda")
    assert mla.kv.backend == "native" and mla.kv.block_tokens == 16
    cpu = make_plan(config_for(demo_dir), model_facts.read(demo_dir), make_host(None), "cpu")
    assert (cpu.kv.block_tokens, cpu.kv.chunk_tokens) == (128, 128)
