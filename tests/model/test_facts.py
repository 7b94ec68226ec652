from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shapes import DEEPSEEK_V2_LITE, GEMMA3_4B_TEXT, LLAMA3_8B, QWEN3_30B_A3B, write_shape
from vllm_offload.model import facts as model_facts
from vllm_offload.model.config_json import ModelFactsError


def test_llama(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, LLAMA3_8B))
    assert (facts.num_layers, facts.num_kv_heads, facts.head_dim) == (32, 8, 128)
    assert {layer.kind for layer in facts.layers} == {"full"}
    assert facts.weight_bytes_source == "parameter count"
    assert facts.weight_bytes == pytest.approx(16.06e9, rel=0.01)  # 8.03 B params in bf16


def test_gemma3_sliding_pattern(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, GEMMA3_4B_TEXT))
    kinds = [layer.kind for layer in facts.layers]
    assert kinds.count("full") == 5 and kinds.count("sliding") == 29
    assert facts.layers[0].window == 1024


def test_gemma3_nested_text_config(tmp_path: Path) -> None:
    outer = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": GEMMA3_4B_TEXT,
    }
    facts = model_facts.read(write_shape(tmp_path, outer))
    assert facts.architecture == "Gemma3ForConditionalGeneration"
    assert facts.num_layers == 34


def test_mla(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, DEEPSEEK_V2_LITE))
    assert facts.layers[0].kind == "mla"
    assert (facts.layers[0].kv_lora_rank, facts.layers[0].rope_dim) == (512, 64)


def test_moe_weights_estimate(tmp_path: Path) -> None:
    facts = model_facts.read(write_shape(tmp_path, QWEN3_30B_A3B))
    assert facts.weight_bytes == pytest.approx(61.0e9, rel=0.02)  # 30.5 B params in bf16
    assert facts.experts == 128


def test_mixtral_experts_are_counted(tmp_path: Path) -> None:
    """Mixtral names its experts num_local_experts: read as a dense model, its 46.7 B
    parameters were planned as 7.2 B."""
    mixtral = LLAMA3_8B | {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
    }
    facts = model_facts.read(write_shape(tmp_path, mixtral))
    assert facts.experts == 8
    assert facts.weight_bytes == pytest.approx(93.4e9, rel=0.02)  # 46.7 B params in bf16


def test_mlp_widths_and_experts_per_token(tmp_path: Path) -> None:
    """What the prefill chunk's activations are planned from (issue #41): the MLP widths and
    the experts a token goes through; an MoE naming none is planned as 8, and says so."""
    dense = model_facts.read(write_shape(tmp_path / "d", LLAMA3_8B))
    assert (dense.intermediate_size, dense.experts_per_token) == (14336, 0)
    moe = model_facts.read(write_shape(tmp_path / "m", QWEN3_30B_A3B))
    assert (moe.moe_intermediate_size, moe.experts_per_token, moe.unknown) == (768, 8, ())
    mixtral = dict(QWEN3_30B_A3B, num_experts_per_tok=2)
    assert model_facts.read(write_shape(tmp_path / "x", mixtral)).experts_per_token == 2
    unnamed = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts_per_tok"}
    unread = model_facts.read(write_shape(tmp_path / "u", unnamed))
    assert unread.experts_per_token == 8
    assert unread.unknown == ("experts per token (num_experts_per_tok; planned as 8)",)


def test_linear_layers_have_no_per_token_kv(tmp_path: Path) -> None:
    hybrid = dict(
        LLAMA3_8B,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    )
    facts = model_facts.read(write_shape(tmp_path, hybrid))
    assert [layer.kind for layer in facts.layers] == ["linear"] * 3 + ["full"]


def test_unknown_layer_type_is_reported(tmp_path: Path) -> None:
    odd = dict(LLAMA3_8B, num_hidden_layers=2, layer_types=["full_attention", "hyper"])
    facts = model_facts.read(write_shape(tmp_path, odd))
    assert facts.unknown == ("layer type 'hyper' (planned as full attention)",)


def test_quantization(tmp_path: Path) -> None:
    quant = dict(LLAMA3_8B, quantization_config={"quant_method": "awq", "bits": 4})
    assert model_facts.read(write_shape(tmp_path, quant)).quantization == "awq"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"hidden_size": 8}), "'num_hidden_layers' is missing"),
        (json.dumps(dict(LLAMA3_8B, num_attention_heads="many")), "'num_attention_heads'"),
    ],
)
def test_garbled_config(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ModelFactsError, match=message):
        model_facts.read(tmp_path)


def test_garbled_safetensors_header(tmp_path: Path) -> None:
    write_shape(tmp_path, LLAMA3_8B)
    (tmp_path / "model.safetensors").write_bytes((20).to_bytes(8, "little") + b"{garbage" * 3)
    with pytest.raises(ModelFactsError, match="garbled safetensors header"):
        model_facts.read(tmp_path)


def crafted_configs() -> list[tuple[str, bytes]]:
    """config.json files an attacker who can write a model root planted (issue #29)."""
    base = dict(LLAMA3_8B)
    crafted: list[tuple[str, bytes]] = [
        ("nan", json.dumps(base).replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": NaN').encode()),
        ("infinity", json.dumps(dict(base, rope_theta=1)).replace("1,", "Infinity,", 1).encode()),
        ("1e400", json.dumps(dict(base, vocab_size=7)).replace(": 7", ": 1e400").encode()),
        ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("null", b"null"),
    ]
    for key, value in [
        ("num_hidden_layers", 200_000_000),
        ("num_hidden_layers", -32),
        ("hidden_size", 0),
        ("num_key_value_heads", "8"),
        ("num_key_value_heads", [8]),
        ("head_dim", -128),
        ("head_dim", 1.5),
        ("max_position_embeddings", -1),
        ("max_position_embeddings", 1e30),
        ("vocab_size", -5),
        ("sliding_window", "x"),
        ("sliding_window", -4096),
        ("num_attention_heads", 10**30),
        ("intermediate_size", -1),
        ("num_experts", -8),
        ("torch_dtype", {"a": 1}),
        ("quantization_config", {"quant_method": [1]}),
        ("kv_lora_rank", -512),
    ]:
        crafted.append((f"{key}={value!r}", json.dumps(dict(base, **{key: value})).encode()))
    return crafted


def crafted_headers() -> list[tuple[str, bytes]]:
    entries = [
        {"w": {"dtype": "BF16"}},
        {"w": {"dtype": "BF16", "shape": [-4096, 4096]}},
        {"w": {"dtype": "BF16", "shape": ["4096"]}},
        {"w": {"dtype": 7, "shape": [2]}},
        {"w": [1, 2]},
        {"w": {"dtype": "BF16", "shape": [1 << 40, 1 << 40]}},
    ]
    headers = [json.dumps(entry).encode() for entry in entries] + [b"[1]", b"NaN"]
    return [(h.decode()[:30], len(h).to_bytes(8, "little") + h) for h in headers]


@pytest.mark.parametrize(("name", "content"), crafted_configs())
def test_crafted_configs_exit_2_naming_the_model_path(
    tmp_path: Path, name: str, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tracebacks (exit 1), negative bytes (exit 0) or minutes of work on the old code."""
    from vllm_offload.cli import main

    (tmp_path / "config.json").write_bytes(content)
    for command in (["plan", "--gpu-mem-gib", "24"], ["serve", "--dry-run"]):
        assert main([*command, "--model", str(tmp_path)]) == 2, name
        assert "error: model.path: " in capsys.readouterr().err


@pytest.mark.parametrize(("name", "header"), crafted_headers())
def test_crafted_safetensors_headers_exit_2(
    tmp_path: Path, name: str, header: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_offload.cli import main

    write_shape(tmp_path, LLAMA3_8B)
    (tmp_path / "model.safetensors").write_bytes(header)
    assert main(["plan", "--gpu-mem-gib", "24", "--model", str(tmp_path)]) == 2, name
    assert "error: model.path: " in capsys.readouterr().err


def read_within(directory: Path, seconds: float = 60) -> BaseException | None:
    """model_facts.read in a thread; what it raised (None: nothing). Fails if it is still
    reading after ``seconds`` (a FIFO held the old reader for good)."""
    import threading

    raised: list[BaseException | None] = []

    def work() -> None:
        try:
            model_facts.read(directory)
            raised.append(None)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still reading {directory} after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("planted", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_only_regular_files_are_read(tmp_path: Path, planted: str, kind: str) -> None:
    """A FIFO blocked the manager's threads for good; a link to /dev/zero read until
    memory ran out."""
    import os

    write_shape(tmp_path, LLAMA3_8B)
    target = tmp_path / planted
    target.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    error = read_within(tmp_path)
    assert isinstance(error, ModelFactsError) and error.field == "model.path", error
    assert "not a regular file" in error.message or "no config.json" in error.message


def test_an_oversized_config_is_not_read_whole(tmp_path: Path) -> None:
    write_shape(tmp_path, LLAMA3_8B)
    with (tmp_path / "config.json").open("r+b") as f:
        f.truncate(model_facts.MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    error = read_within(tmp_path)
    assert isinstance(error, ModelFactsError) and "larger than" in error.message
