from __future__ import annotations

import json
from pathlib import Path

from vllm_offload.model import demo as demo_model
from vllm_offload.model import facts as model_facts


def test_demo_model_files(demo_dir: Path) -> None:
    names = sorted(p.name for p in demo_dir.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    facts = model_facts.read(demo_dir)
    assert facts.architecture == "LlamaForCausalLM"
    assert facts.weight_bytes_source == "safetensors"
    assert facts.weight_bytes == (demo_dir / "model.safetensors").stat().st_size - (
        8 + int.from_bytes((demo_dir / "model.safetensors").read_bytes()[:8], "little")
    )


def test_tokenizer_and_chat_template(demo_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_dir))
    ids = tok("hello world server")["input_ids"]
    assert tok.decode(ids) == "hello world server"
    assert max(ids) < json.loads((demo_dir / "config.json").read_text())["vocab_size"]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_seed_changes_weights(tmp_path: Path) -> None:
    a = demo_model.write(tmp_path / "a", seed=1)
    b = demo_model.write(tmp_path / "b", seed=2)
    assert (a / "model.safetensors").read_bytes() != (b / "model.safetensors").read_bytes()
