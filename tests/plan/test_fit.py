"""Auto-fit (issue #18): a length and a number of requests in, the fewest offloaded weights
(and, with kv_cache_dtype = 'fit', the KV dtype) out; what cannot be reached is refused
with the longest length that can, and combinations known to fail are refused or warned.
Every expected number is worked out here from the model's shape, not asked of the
planner."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import make_host
from tests.shapes import DEEPSEEK_V2_LITE, GEMMA3_4B_TEXT, LLAMA3_8B, QWEN3_30B_A3B, write_shape
from vllm_offload.config import DeploymentConfig, load, with_overrides
from vllm_offload.deployment import prepare
from vllm_offload.hardware import GIB, GpuFacts, declared
from vllm_offload.launch import build
from vllm_offload.model import facts as model_facts
from vllm_offload.plan import Plan, PlanError, make_plan, render

LLAMA3_70B = Path(__file__).parents[2] / "benchmarks/models/llama-3.1-70b"
# A Qwen3-Next-like hybrid: three linear-attention layers to every full one.
HYBRID: dict[str, Any] = dict(
    LLAMA3_8B,
    layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)],
)
FAMILIES = {  # name: (config.json, the length asked for)
    "dense GQA (Llama-3-8B)": (dict(LLAMA3_8B, max_position_embeddings=131072), 32768),
    "MoE (Qwen3-30B-A3B)": (QWEN3_30B_A3B, 32768),
    "sliding window (Gemma-3-4B)": (GEMMA3_4B_TEXT, 65536),
    "MLA (DeepSeek-V2-Lite)": (DEEPSEEK_V2_LITE, 65536),
}
BLOCK = 128  # the native tier's block on plain attention (MLA: 16, vLLM's default)


def plan_of(directory: Path, gpu_gib: float, **overrides: Any) -> Plan:
    config = with_overrides(DeploymentConfig(), {"model.path": str(directory), **overrides})
    return make_plan(config, model_facts.read(directory), make_host(gpu_gib, 256, 128), "cuda")


def kv_bytes(cfg: dict[str, Any], tokens: int, block: int, dtype_bytes: int = 2) -> int:
    """One request's GPU KV in whole blocks, from config.json: MLA keeps one latent + rope
    key per token; sliding layers their window (plus the block being filled)."""
    layers = cfg["num_hidden_layers"]
    if cfg.get("kv_lora_rank"):
        per_token = (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * dtype_bytes
        return layers * math.ceil(tokens / block) * block * per_token
    per_token = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * dtype_bytes
    kinds = cfg.get("layer_types", ["full_attention"] * layers)
    total = 0
    for kind in kinds:
        kept = tokens if kind == "full_attention" else min(tokens, cfg["sliding_window"] + block)
        total += math.ceil(kept / block) * block * per_token
    return total


def per_block(cfg: dict[str, Any], block: int, dtype_bytes: int = 2) -> int:
    return (
        kv_bytes(cfg, 1, block, dtype_bytes)
        if cfg.get("kv_lora_rank")
        else (
            cfg["num_hidden_layers"]
            * 2
            * cfg["num_key_value_heads"]
            * cfg["head_dim"]
            * dtype_bytes
            * block
        )
    )


def expected_offload(plan: Plan, cfg: dict[str, Any], tokens: int, requests: int) -> int:
    """Weights to offload: the pool for ``requests`` x ``tokens`` (whole blocks each, plus
    vLLM's null block) must fit beside the rest; rounded up to 0.1 GiB."""
    block = plan.kv.block_tokens
    blocks = requests * math.ceil(kv_bytes(cfg, tokens, block) / per_block(cfg, block)) + 1
    # vLLM's working memory, as planned: a dense model's with CUDA graphs (vLLM's default)
    working = 1 * GIB + cfg["hidden_size"] * 128 * 1024
    if cfg.get("num_experts") or cfg.get("n_routed_experts"):
        working += int(0.65 * GIB)
    else:
        working += int(0.9 * GIB) + cfg["hidden_size"] * 100 * 1024
    need = plan.weights.bytes + working + blocks * per_block(cfg, block) - plan.gpu.budget_bytes
    return 0 if need <= 0 else math.ceil(need / GIB * 10) * GIB // 10


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("gpu_gib", [16, 24, 48, 80])
@pytest.mark.parametrize("requests", [1, 2])
def test_auto_offloads_the_fewest_weights_for_the_target(
    tmp_path: Path, family: str, gpu_gib: int, requests: int
) -> None:
    cfg, tokens = FAMILIES[family]
    directory = write_shape(tmp_path / "model", cfg)
    overrides = {
        "model.max_model_len": tokens,
        "weights_offload.cpu_gib": "auto",
        "gpu.min_concurrent_requests": requests,
    }
    try:
        plan = plan_of(directory, gpu_gib, **overrides)
    except PlanError as exc:
        # Only when even the whole decoder stack in host RAM leaves too small a pool.
        assert exc.field == "model.max_model_len" and "every decoder layer" in exc.message
        assert (family, gpu_gib) == ("MoE (Qwen3-30B-A3B)", 16) or gpu_gib <= 24, exc.message
        return
    assert plan.gpu.budget_bytes == int(gpu_gib * GIB * 0.9)
    expected = expected_offload(plan, cfg, tokens, requests)
    assert plan.weights.offloaded_bytes == min(expected, plan.weights.bytes)
    # The pool holds what was asked, and 0.1 GiB less offloaded would not have.
    request_blocks = math.ceil(
        kv_bytes(cfg, tokens, plan.kv.block_tokens) / plan.kv.bytes_per_block
    )
    need = (requests * request_blocks + 1) * plan.kv.bytes_per_block
    assert plan.gpu.kv_pool_bytes >= need
    assert plan.length.concurrency_at_full_length >= requests
    if plan.weights.offloaded_bytes:
        assert plan.gpu.kv_pool_bytes - GIB // 10 < need
        assert any(d.startswith("weights_offload.cpu_gib auto ->") for d in plan.notes.decisions)
        assert plan.costs.decode_steps_per_s_ceiling == pytest.approx(
            plan.costs.h2d_bytes_per_s / plan.weights.offloaded_bytes, rel=0.01
        )


def test_the_numbers_of_a_70b_on_80_gib(tmp_path: Path) -> None:
    """The README's 80 GiB example, worked by hand: 131.41 GiB of bf16 weights, 72 GiB
    budget, 3.7 GiB working memory (1.9 GiB + 228 KiB a hidden unit, CUDA graphs counted);
    32,768 tokens x 320 KiB = 10 GiB (+ one block)."""
    plan = plan_of(
        LLAMA3_70B, 80, **{"model.max_model_len": 32768, "weights_offload.cpu_gib": "auto"}
    )
    cfg = model_facts.read(LLAMA3_70B)
    assert plan.kv.bytes_per_token == 80 * 2 * 8 * 128 * 2 == 327680
    pool_needed = (32768 // 128 + 1) * 128 * 327680
    working = int(1.9 * GIB) + 8192 * 228 * 1024
    need = plan.weights.bytes + working + pool_needed - int(80 * GIB * 0.9)
    assert plan.weights.offloaded_bytes == math.ceil(need / GIB * 10) * GIB // 10
    assert plan.weights.offloaded_bytes == int(73.2 * GIB)
    assert plan.length.longest_request_tokens >= 32768 and cfg.num_layers == 80
    # Before #18 'auto' left room for 4,096 tokens and 32,768 was refused.
    short = plan_of(LLAMA3_70B, 80, **{"weights_offload.cpu_gib": "auto"})
    assert short.weights.offloaded_bytes < plan.weights.offloaded_bytes


def test_unreachable_says_the_longest_reachable_and_what_else_helps(tmp_path: Path) -> None:
    cfg = dict(LLAMA3_8B, max_position_embeddings=131072)
    directory = write_shape(tmp_path / "m", cfg)
    with pytest.raises(PlanError) as info:
        plan_of(
            directory,
            24,
            **{
                "model.max_model_len": 131072,
                "weights_offload.cpu_gib": "auto",
                "gpu.min_concurrent_requests": 4,
            },
        )
    assert info.value.field == "model.max_model_len"
    # Everything offloadable goes: the decoder layers (all weights less the embeddings and
    # the LM head); the pool left is the budget less the rest and working memory.
    facts = model_facts.read(directory)
    embeddings = 2 * 128256 * 4096 * 2
    layers = (facts.weight_bytes - embeddings) // 32 * 32
    working = int(1.9 * GIB) + 4096 * 228 * 1024  # CUDA graphs counted
    pool = int(24 * GIB * 0.9) - (facts.weight_bytes - layers) - working
    per_request = (pool // (32 * 2 * 8 * 128 * 2 * 128) - 1) // 4  # blocks for each of 4
    assert f"set model.max_model_len <= {per_request * 128:,}" in info.value.message
    fp8 = ((pool // (32 * 2 * 8 * 128 * 128) - 1) // 4) * 128
    assert f"model.kv_cache_dtype = 'fp8' ({fp8:,} tokens)" in info.value.message
    assert "gpu.memory_utilization = 0.95" in info.value.message
    assert "parallel.tensor_parallel_size = 2" in info.value.message


def test_kv_cache_dtype_fit_picks_fp8_only_when_the_model_dtype_needs_more_offload(
    tmp_path: Path,
) -> None:
    directory = write_shape(tmp_path / "m", dict(LLAMA3_8B, max_position_embeddings=131072))
    fit = {"model.kv_cache_dtype": "fit", "weights_offload.cpu_gib": "auto"}
    # 24 GiB: 21.6 budget - 14.96 weights - 2.79 working (CUDA graphs counted) = ~3.85 GiB
    # of pool. 16k tokens of bf16 KV (2 GiB) fit: model dtype. 56k (7 GiB) do not, fp8's
    # 3.5 GiB do: fp8, nothing offloaded.
    short = plan_of(directory, 24, **fit, **{"model.max_model_len": 16384})
    assert (short.kv.cache_dtype, short.kv.dtype_bytes) == ("auto", 2)
    long = plan_of(directory, 24, **fit, **{"model.max_model_len": 57344})
    assert (long.kv.cache_dtype, long.kv.dtype_bytes, long.weights.offloaded_bytes) == ("fp8", 1, 0)
    assert any(d.startswith("model.kv_cache_dtype fit -> fp8") for d in long.notes.decisions)
    assert build(DeploymentConfig(), long, directory).option("--kv-cache-dtype") == "fp8"
    assert build(DeploymentConfig(), short, directory).option("--kv-cache-dtype") is None
    # 'auto' stays the model's dtype and offloads instead.
    auto = plan_of(
        directory, 24, **{"weights_offload.cpu_gib": "auto", "model.max_model_len": 65536}
    )
    assert auto.kv.dtype_bytes == 2 and auto.weights.offloaded_bytes > 0


def test_concurrent_requests_are_held_or_refused(tmp_path: Path) -> None:
    directory = write_shape(tmp_path / "m", dict(LLAMA3_8B, max_position_embeddings=131072))
    with pytest.raises(PlanError) as info:  # no offload allowed: the pool is ~3.85 GiB
        plan_of(directory, 24, **{"model.max_model_len": 16384, "gpu.min_concurrent_requests": 4})
    assert info.value.field == "gpu.min_concurrent_requests"
    assert "weights_offload.cpu_gib = 'auto'" in info.value.message
    # max_model_len 'auto' with several requests: the longest each of them can have, passed
    # to vLLM as a number (its own auto-fit is for one request).
    plan = plan_of(directory, 24, **{"gpu.min_concurrent_requests": 4})
    blocks = plan.gpu.kv_pool_blocks - 1
    assert plan.length.max_model_len == blocks // 4 * 128
    spec = build(DeploymentConfig(), plan, directory)
    assert spec.option("--max-model-len") == str(plan.length.max_model_len)


def test_plan_prints_its_decisions(tmp_path: Path) -> None:
    text = render(
        plan_of(LLAMA3_70B, 80, **{"model.max_model_len": 32768, "weights_offload.cpu_gib": "auto"})
    )
    assert "chose: weights_offload.cpu_gib auto -> 73.20 GiB per GPU" in text
    assert "chose: decode speed cost:" in text and "PCIe Gen4 x16, assumed" in text


def test_h2d_speed_follows_the_pcie_link() -> None:
    host = make_host(80)
    gen5 = replace(
        host,
        gpus=(
            GpuFacts(
                index=0,
                name="H100",
                total_bytes=80 * GIB,
                free_bytes=80 * GIB,
                pcie_generation=5,
                pcie_width=16,
            ),
        ),
    )
    gen3x8 = replace(
        host,
        gpus=(
            GpuFacts(
                index=0,
                name="old",
                total_bytes=80 * GIB,
                free_bytes=80 * GIB,
                pcie_generation=3,
                pcie_width=8,
            ),
        ),
    )
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(LLAMA3_70B), "weights_offload.cpu_gib": "auto"}
    )
    facts = model_facts.read(LLAMA3_70B)
    fast = make_plan(config, facts, gen5, "cuda")
    slow = make_plan(config, facts, gen3x8, "cuda")
    assert fast.costs.h2d_bytes_per_s == pytest.approx(55.47e9)  # the H200 measurement
    assert "measured on an H200" in fast.costs.h2d_source
    assert slow.costs.h2d_bytes_per_s == pytest.approx(55.47e9 / 4 / 2)  # 8 of 32 GT/s, 8 lanes
    assert fast.costs.decode_steps_per_s_ceiling == pytest.approx(
        55.47e9 / fast.weights.offloaded_bytes, rel=0.01
    )


# --- known-bad combinations ---------------------------------------------------------------


def test_expandable_segments_with_the_tier_is_refused(tmp_path: Path) -> None:
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    facts, host = model_facts.read(directory), make_host(24)
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6,expandable_segments:True"}
    config = with_overrides(DeploymentConfig(), {"model.path": str(directory)})
    plan = make_plan(config, facts, host, "cuda", env=env)
    (problem,) = plan.notes.problems
    assert problem["field"] == "PYTORCH_CUDA_ALLOC_CONF" and "#41237" in problem["message"]
    assert "cannot start: PYTORCH_CUDA_ALLOC_CONF" in render(plan)
    without_tier = with_overrides(config, {"kv_offload.backend": "none"})
    assert make_plan(without_tier, facts, host, "cuda", env=env).notes.problems == ()


def test_lmcache_on_hybrid_models(tmp_path: Path) -> None:
    hybrid = write_shape(tmp_path / "hybrid", HYBRID)
    plan = plan_of(hybrid, 24, **{"kv_offload.backend": "lmcache"})
    assert [p["field"] for p in plan.notes.problems] == ["kv_offload.backend"]
    assert "#42911" in plan.notes.problems[0]["message"]
    assert plan_of(hybrid, 24, **{"kv_offload.backend": "native"}).notes.problems == ()
    # Sliding-window layers keep every token when vLLM turns its hybrid manager off: a
    # full-length request costs all 34 layers, not 6 full + 28 windows.
    gemma = write_shape(tmp_path / "gemma", GEMMA3_4B_TEXT)
    common = {"model.max_model_len": 32768, "kv_offload.block_size": 16}
    native = plan_of(gemma, 48, **common, **{"kv_offload.backend": "native"})
    lmcache = plan_of(gemma, 48, **common, **{"kv_offload.backend": "lmcache"})
    per_token = 2 * 4 * 256 * 2
    assert lmcache.length.concurrency_at_full_length == pytest.approx(
        lmcache.gpu.kv_pool_blocks / (34 * per_token * 32768 // (34 * per_token * 16)), abs=0.01
    )
    assert native.length.concurrency_at_full_length > 3 * lmcache.length.concurrency_at_full_length
    assert any("#41847" in w for w in lmcache.notes.warnings)


def test_speculative_decoding_with_the_tier_warns(tmp_path: Path) -> None:
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    spec = ['--speculative-config={"method": "eagle3", "num_speculative_tokens": 3}']
    plan = plan_of(directory, 24, extra_args=spec)
    assert any("speculative drafter" in w and "#46971" in w for w in plan.notes.warnings)
    assert not any("speculative" in w for w in plan_of(directory, 24).notes.warnings)


def test_a_low_memlock_limit_is_not_refused(tmp_path: Path) -> None:
    """Measured on the H200 host (benchmarks/results/h200-vllm-0.32.0/host-checks/):
    cudaHostRegister page-locked 4 GiB at 55.4 GB/s under an 8 MiB memlock limit without
    CAP_IPC_LOCK; the driver does not count it. A refusal would block a tier that works."""
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    config = with_overrides(
        DeploymentConfig(), {"model.path": str(directory), "kv_offload.cpu_tier_gib": 16}
    )
    limited = replace(make_host(24), memlock_limit_bytes=8 << 20)
    assert make_plan(config, model_facts.read(directory), limited, "cuda").notes.problems == ()


def test_wsl2_is_explained(tmp_path: Path) -> None:
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    config = with_overrides(DeploymentConfig(), {"model.path": str(directory)})
    facts, wsl = model_facts.read(directory), replace(make_host(24), wsl=True)
    warnings = make_plan(config, facts, wsl, "cuda").notes.warnings
    assert any("VLLM_WSL2_ENABLE_PIN_MEMORY=1" in w and "pageable" in w for w in warnings)
    pinned = make_plan(config, facts, wsl, "cuda", env={"VLLM_WSL2_ENABLE_PIN_MEMORY": "1"})
    assert any("half the RAM" in w for w in pinned.notes.warnings)
    assert not any(
        "WSL2" in w for w in make_plan(config, facts, make_host(24), "cuda").notes.warnings
    )


def test_the_24gb_example_passes_its_own_check(tmp_path: Path) -> None:
    """examples/config-24gb.toml on the host it describes: an RTX 4090 and 128 GB of RAM,
    whose /dev/shm is half of it (Linux's default), so a 64 GiB tier cannot be mapped."""
    example = load(Path(__file__).parents[2] / "examples/config-24gb.toml")
    model = write_shape(
        tmp_path / "Meta-Llama-3.1-8B-Instruct", dict(LLAMA3_8B, max_position_embeddings=131072)
    )
    config = with_overrides(example, {"model.path": str(model), "server.api_key_file": ""})
    host = declared(make_host(None), gpu_mem_gib=24, ram_gib=128)
    assert host.shm_free_bytes == 64 * GIB
    prepared = prepare(config, host, {}, None)
    assert prepared.problems == ()
    assert prepared.plan.cpu_tier.bytes == 63 * GIB  # /dev/shm less what vLLM uses itself


def test_review_findings_fit_baseline_and_a_fixed_pool(tmp_path: Path) -> None:
    """'fit' with several short requests plans what 'auto' plans (its baseline once aimed
    at 4,096-token requests x the count); a fixed pool that cannot fit names its own key."""
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    target = {
        "model.max_model_len": 2048,
        "gpu.min_concurrent_requests": 8,
        "weights_offload.cpu_gib": "auto",
    }
    auto = plan_of(directory, 8, **target)
    fit = plan_of(directory, 8, **target, **{"model.kv_cache_dtype": "fit"})
    assert auto.weights.offloaded_bytes > 0 and fit.length.max_model_len == 2048
    with pytest.raises(PlanError) as info:
        plan_of(
            directory,
            24,
            **{"weights_offload.cpu_gib": "auto", "gpu.kv_cache_memory_bytes": 20 * GIB},
        )
    assert info.value.field == "gpu.kv_cache_memory_bytes"


def test_a_fixed_pool_past_the_card_with_weights_kept_there(tmp_path: Path) -> None:
    """Security round 3's review: cpu_gib set (not auto) and a fixed pool larger than the
    card less the weights planned a pool vLLM could not allocate (it takes the figure
    past memory_utilization, then fails after loading the weights)."""
    directory = write_shape(tmp_path / "m", LLAMA3_8B)
    with pytest.raises(PlanError) as info:
        plan_of(
            directory, 24, **{"weights_offload.cpu_gib": 0, "gpu.kv_cache_memory_bytes": 20 * GIB}
        )
    assert info.value.field == "gpu.kv_cache_memory_bytes"
    largest = int(info.value.message.split("<= ")[1].split(" bytes")[0])
    assert 0 < largest < 10 * GIB  # 24 GiB less ~15 GiB of bf16 weights less working memory
    fits = plan_of(
        directory, 24, **{"weights_offload.cpu_gib": 0, "gpu.kv_cache_memory_bytes": largest}
    )
    assert fits.gpu.kv_pool_bytes == largest
    offloaded = plan_of(
        directory, 24, **{"weights_offload.cpu_gib": 8, "gpu.kv_cache_memory_bytes": 12 * GIB}
    )
    assert offloaded.gpu.kv_pool_bytes == 12 * GIB
