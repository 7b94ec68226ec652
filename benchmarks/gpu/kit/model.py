"""The model an experiment serves: a config.json shape (with dummy weights) or a random
checkpoint beside it, and a tokenizer vLLM can return logprobs through."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

GIB = 1 << 30
BENCH_GPU = Path(__file__).resolve().parents[1]
MODEL_CONFIG = BENCH_GPU.parent / "models/llama-3.1-8b/config.json"
VOCAB = 128256
KV_BYTES_PER_TOKEN = 128 * 1024  # the 8B shape: 32 layers x K,V x 8 heads x 128 x bf16


def write_model(
    folder: Path, weights: Path | None, *, config: Path = MODEL_CONFIG, vocab: int = VOCAB
) -> Path:
    """``config`` and a tokenizer whose token i is the word 't<i>' for each of the model's
    ``vocab`` ids (vLLM needs one for logprobs; dummy weights barely depend on the
    context, so equal tokens alone prove little: the logprobs must be equal too)."""
    if weights is not None:  # a checkpoint beside its config.json
        folder = weights
    folder.mkdir(parents=True, exist_ok=True)
    if weights is None:
        shutil.copy(config, folder / "config.json")
    settings = {"bos_token": "t128000", "eos_token": "t128001", "model_max_length": 131072}
    write_tokenizer(folder, vocab, settings=settings)
    return folder


def write_tokenizer(
    folder: Path,
    vocab: int,
    *,
    special: dict[str, int] | None = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """tokenizer.json, whose token i is the word 't<i>' (or a ``special`` token's name), and
    tokenizer_config.json with ``settings`` (its bos/eos tokens, length, chat template)."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(vocab)}
    for name, index in (special or {}).items():
        words.pop(f"t{index}", None)
        words[name] = index
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(name, special=True) for name in special or {}])
    tokenizer.save(str(folder / "tokenizer.json"))
    fields = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0", **(settings or {})}
    (folder / "tokenizer_config.json").write_text(json.dumps(fields, indent=1))


def random_checkpoint(folder: Path, *, config: Path = MODEL_CONFIG, std: float = 0.02) -> Path:
    """A random checkpoint of deviation ``std`` (random_checkpoint.py; ~22 s for 8B on an
    H200), written once: a folder that has one is kept. With its tokenizer."""
    if not (folder / "model.safetensors.index.json").exists():
        script = BENCH_GPU / "random_checkpoint.py"
        command = [sys.executable, str(script), str(config), str(folder), "--std", str(std)]
        subprocess.run(command, check=True)
    return write_model(folder, folder)


def split_line(log: str) -> dict[str, int] | None:
    """Patch 0006's log line: the GPU and host blocks/tokens of the pool."""
    found = re.search(
        r"KV pool host extension: (\d+) blocks \((\d+) tokens\) in GPU memory, "
        r"then (\d+) blocks \((\d+) tokens",
        log,
    )
    if not found:
        return None
    gpu_blocks, gpu_tokens, host_blocks, host_tokens = map(int, found.groups())
    return {
        "gpu_blocks": gpu_blocks,
        "gpu_tokens": gpu_tokens,
        "host_blocks": host_blocks,
        "host_tokens": host_tokens,
    }
