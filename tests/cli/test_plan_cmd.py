from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shapes import LLAMA3_8B, LLAMA_70B, QWEN3_30B_A3B, write_shape
from vllm_offload.cli import main


def test_unknown_architecture_is_planned_from_its_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    odd = dict(
        LLAMA3_8B,
        architectures=["FooForCausalLM"],
        model_type="foo",
        num_hidden_layers=2,
        layer_types=["full_attention", "hyper_attention"],
    )
    model = write_shape(tmp_path / "foo", odd)
    assert main(["plan", "--model", str(model), "--gpu-mem-gib", "24", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["architecture"] == "FooForCausalLM"
    assert plan["kv_bytes_per_token"] == 2 * 2 * 8 * 128 * 2
    assert plan["unplanned"] == ["layer type 'hyper_attention' (planned as full attention)"]


@pytest.mark.parametrize(
    ("content", "message"),
    [("{oops", "not valid JSON"), ('{"hidden_size": 4}', "'num_hidden_layers' is missing")],
)
def test_garbled_config_json_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    (tmp_path / "config.json").write_text(content)
    assert main(["plan", "--model", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_declared_gpu_smaller_than_the_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_shape(tmp_path / "qwen", QWEN3_30B_A3B)
    assert main(["plan", "--model", str(model), "--gpu-mem-gib", "24"]) == 2
    err = capsys.readouterr().err
    assert "weights_offload.cpu_gib" in err and "do not fit" in err
    assert (
        main(
            [
                "plan",
                "--model",
                str(model),
                "--gpu-mem-gib",
                "24",
                "--ram-gib",
                "128",
                "--weights-offload-cpu-gib",
                "auto",
            ]
        )
        == 0
    )
    assert "on GPU / offloaded" in capsys.readouterr().out


def test_the_commonest_refusals_print_the_plan_of_their_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #56: weights or a length that do not fit printed no plan (only `error:` on
    stderr, --json empty), where README and --help promise it either way."""
    model = write_shape(tmp_path / "qwen", QWEN3_30B_A3B)
    declared = ["--gpu-mem-gib", "24", "--ram-gib", "128"]
    assert main(["plan", "--model", str(model), *declared]) == 2
    out = capsys.readouterr().out
    assert "on GPU / offloaded" in out and "cannot start: weights_offload.cpu_gib" in out
    assert "the plan above is the one with weights_offload.cpu_gib = 'auto'" in out
    llama = write_shape(tmp_path / "llama", LLAMA3_8B)
    too_long = ["--model-max-model-len", "100000", "--model-allow-long-max-model-len", "true"]
    assert main(["plan", "--model", str(llama), *declared, *too_long, "--json"]) == 2
    plan = json.loads(capsys.readouterr().out)
    assert plan["planned_with"] == {"model.max_model_len": "auto"}
    (problem,) = plan["problems"]
    assert problem["field"] == "model.max_model_len"
    assert "model.kv_cache_dtype = 'fit'" in problem["message"]  # doubles a 32B-AWQ pool
    assert plan["max_model_len"] == 8192


def test_plan_exits_2_when_the_plan_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `serve --dry-run` (issue #28): the whole plan either way, exit 2 with a reason."""
    model = write_shape(tmp_path / "llama", LLAMA3_8B)
    declared = ["--model", str(model), "--gpu-mem-gib", "24", "--ram-gib", "64"]
    assert main(["plan", *declared]) == 0
    assert "cannot start" not in capsys.readouterr().out
    assert main(["plan", *declared, "--kv-offload-cpu-tier-gib", "500"]) == 2
    out = capsys.readouterr().out
    assert "GPU KV pool" in out
    assert "cannot start: kv_offload.cpu_tier_gib: a 500.00 GiB CPU tier does not fit" in out
    assert main(["plan", *declared, "--kv-offload-cpu-tier-gib", "500", "--json"]) == 2
    plan = json.loads(capsys.readouterr().out)
    assert plan["gpu_kv_pool_bytes"] > 0
    assert [p["field"] for p in plan["problems"]] == ["kv_offload.cpu_tier_gib"] * 2


GOLDEN = Path(__file__).parents[1] / "golden"
README_EXAMPLES = {  # the README's two plan examples: `plan --json`, byte for byte
    "plan-24gb.json": [
        "--config",
        "examples/config-24gb.toml",
        "--server-api-key-file",
        "",
        "--model-max-model-len",
        "65536",
        "--model-kv-cache-dtype",
        "fit",
        "--weights-offload-cpu-gib",
        "auto",
        "--gpu-mem-gib",
        "24",
        "--ram-gib",
        "128",
    ],
    "plan-70b.json": [
        "--gpu-mem-gib",
        "80",
        "--ram-gib",
        "256",
        "--model-max-model-len",
        "32768",
        "--weights-offload-cpu-gib",
        "auto",
    ],
}


@pytest.mark.parametrize("golden", sorted(README_EXAMPLES))
def test_readme_examples_plan_json_is_unchanged(
    golden: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).parents[2])
    if golden == "plan-24gb.json":
        model = write_shape(
            tmp_path / "Meta-Llama-3.1-8B-Instruct", dict(LLAMA3_8B, max_position_embeddings=131072)
        )
    else:
        model = Path("benchmarks/models/llama-3.1-70b").absolute()
    assert main(["plan", "--model", str(model), *README_EXAMPLES[golden], "--json"]) == 0
    out = capsys.readouterr().out.replace(str(model), "<MODEL>")
    assert out == (GOLDEN / golden).read_text()


def test_a_cluster_config_says_which_boxes_serve_each_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #44: `plan` on the router's config lists each model's boxes (in the plan's JSON
    too, one document)."""
    model = write_shape(tmp_path / "llama", LLAMA3_8B)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[model]\npath = "{model}"\n\n[cluster]\nboxes = ['
        '{ name = "gpu1", url = "http://10.0.0.1:8000", models = ["chat"] }, '
        '{ name = "gpu2", url = "http://gpu2.lan:8000", models = ["chat", "coder"], '
        'model_urls = { coder = "http://10.0.0.2:8000" } }]\n'
    )
    args = ["plan", "--config", str(config), "--gpu-mem-gib", "24"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "  chat: gpu1 (http://10.0.0.1:8000), gpu2 (http://gpu2.lan:8000)\n" in out
    assert "  coder: gpu2 (http://10.0.0.2:8000)" in out
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["coder"] == [
        "gpu2 (http://10.0.0.2:8000)"
    ]


QWEN25_32B_AWQ = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128},
}


def test_a_plan_short_for_chat_says_what_gets_a_chats_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #56: Qwen2.5-32B-AWQ on 24 GB planned 'auto' -> 2,176 tokens, exit 0, with no
    word that chat needs more, or what gets it."""
    model = write_shape(tmp_path / "qwen32", QWEN25_32B_AWQ)
    assert main(["plan", "--model", str(model), "--gpu-mem-gib", "24", "--ram-gib", "128"]) == 0
    out = capsys.readouterr().out
    assert "max_model_len auto -> 2,176 tokens is short for chat" in out
    assert "weights_offload.cpu_gib = 'auto' (17 tokens/s at most" in out and "gets 8,192" in out


def test_gpus_a_model_is_not_planned_on_are_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #56: `--gpu-count 2` without tensor parallelism planned one GPU silently."""
    model = write_shape(tmp_path / "llama", LLAMA3_8B)
    declared = ["plan", "--model", str(model), "--gpu-mem-gib", "24", "--gpu-count", "2"]
    assert main(declared) == 0
    assert "2 GPUs here, and this model is planned on 1 of them" in capsys.readouterr().out
    assert main([*declared, "--parallel-tensor-parallel-size", "2"]) == 0
    assert "GPUs here" not in capsys.readouterr().out


def test_a_model_no_gpu_holds_is_split_over_the_gpus_here(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #59: a 70B model on 2x 80 GB was planned as one GPU holding 131 GiB: it is
    split by tensor parallelism, said, and served so; an amount of weights offload asked
    for keeps it on one GPU."""
    model = write_shape(tmp_path / "llama70", LLAMA_70B)
    declared = ["--model", str(model), "--gpu-mem-gib", "80", "--gpu-count", "2"]
    assert main(["plan", *declared, "--ram-gib", "256"]) == 0
    out = capsys.readouterr().out
    assert "chose: placement: split over GPUs 0,1 (tensor parallel 2)" in out
    assert "GPUs here" not in out
    assert main(["serve", *declared, "--dry-run"]) == 0
    assert "--tensor-parallel-size=2" in capsys.readouterr().out
    assert main(["plan", *declared, "--ram-gib", "256", "--weights-offload-cpu-gib", "70"]) == 0
    out = capsys.readouterr().out
    assert "placement:" not in out and "2 GPUs here, and this model is planned on 1" in out
