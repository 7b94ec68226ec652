"""The files beside a random Qwen2.5-VL checkpoint that vLLM needs to serve images (issue
#46), built here with no download: a word-level tokenizer that knows Qwen's special tokens
and a chat template that puts an image where the OpenAI message has one, the slow
Qwen2VLImageProcessor's preprocessor_config.json, a tiny config for the CPU dry run, and
PNG images written by hand (the client needs no Pillow), sent in a chat request."""

from __future__ import annotations

import base64
import copy
import json
import random
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import httpx

from kit.model import write_tokenizer

# Qwen2.5-VL's special tokens and their ids (its tokenizer's added_tokens)
SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
# Each message as <|im_start|>role text<|im_end|>; an image part as Qwen's own template
# writes it (vLLM's processor expands the one <|image_pad|> to the image's tokens).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %} {{ c['text'] }} {% endif %}{% endfor %}{% endif %}"
    "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json (CLIP's mean and deviation)
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}


def tiny_config(config: dict[str, Any]) -> dict[str, Any]:
    """Qwen2.5-VL's layout at a size a 2-core CPU serves in seconds: two decoder layers of
    width 128 (head_dim 32: vLLM's CPU attention has no 16), a two-block vision tower of
    width 256 (the second with full attention; 5 MiB with its merger, so the launcher's
    3-decimal --cpu-offload-gb is not 0); the real vocabulary and special-token ids."""
    tiny = copy.deepcopy(config)
    tiny |= {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},  # head_dim 32 / 2
    }
    tiny["vision_config"] |= {
        "depth": 2,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_heads": 4,
        "out_hidden_size": 128,
        "fullatt_block_indexes": [1],
    }
    return tiny


def write_processor_files(folder: Path, vocab: int, max_pixels: int) -> None:
    """tokenizer.json (token i is the word 't<i>', Qwen's special tokens by name),
    tokenizer_config.json with the chat template, preprocessor_config.json."""
    settings = {
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "chat_template": CHAT_TEMPLATE,
    }
    write_tokenizer(folder, vocab, special=SPECIAL_TOKENS, settings=settings)
    processor = PREPROCESSOR | {"max_pixels": max_pixels}
    (folder / "preprocessor_config.json").write_text(json.dumps(processor, indent=1))


def png(width: int, height: int, seed: int) -> bytes:
    """An RGB PNG of random pixels (each seed its own image: vLLM caches processed images
    and the prefix cache keeps their tokens, so a repeated image would cost nothing)."""
    rng = random.Random(seed)
    rows = b"".join(b"\0" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 1))
        + chunk(b"IEND", b"")
    )


IMPORT_NAMES = {"pillow": "PIL", "torchvision": "torchvision"}
# torchvision's fake kernels for its compiled ops: they fail when the ops did not load (a
# build for another CUDA than the host torch's, or a CUDA build beside torch+cpu)
FAKE_KERNELS = "torchvision/_meta_registrations.py"


def use_wheels(folder: Path, site: Path) -> list[str]:
    """Each wheel in ``folder`` whose package this Python lacks (the GPU host's bundle has
    neither Pillow nor torchvision; transformers' Qwen2.5-VL processor needs both), unpacked
    into ``site``, put first on sys.path and on PYTHONPATH (the servers inherit it). Where
    torchvision's compiled ops do not load, its fake kernels are emptied in that copy: the
    image path uses only its transforms. What was done, in words."""
    import importlib.util
    import os
    import subprocess
    import sys
    import zipfile

    done: list[str] = []
    for wheel in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
        name = IMPORT_NAMES.get(wheel.name.split("-")[0].lower())
        if name is None or importlib.util.find_spec(name) is not None:
            continue
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
        done.append(f"unpacked {wheel.name}")
    if not done:
        return done
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    check = [sys.executable, "-c", "import torchvision.transforms.v2.functional"]
    if (site / FAKE_KERNELS).exists() and subprocess.run(check, capture_output=True).returncode:
        (site / FAKE_KERNELS).write_text('"""emptied by kit.vlm.use_wheels"""\n')
        done.append(f"emptied {FAKE_KERNELS}: its compiled ops do not load with this torch")
    return done


def tower_bytes(folder: Path) -> int:
    """The bytes of every tensor named visual.* (the tower and its merger), from headers."""
    total = 0
    for path in folder.glob("*.safetensors"):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(
            v["data_offsets"][1] - v["data_offsets"][0]
            for k, v in header.items()
            if k.startswith("visual.")
        )
    return total


def image_request(http: httpx.Client, size: int, seed: int, out_tokens: int) -> dict[str, Any]:
    """One streamed chat completion of a fresh image: TTFT and the prompt's tokens."""
    url = "data:image/png;base64," + base64.b64encode(png(size, size, seed)).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "t5"}]
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": out_tokens,
        "min_tokens": out_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "skip_special_tokens": False,  # every token has text, so the first one is seen
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            choices = chunk.get("choices") or [{}]
            if ttft is None and choices[0].get("delta", {}).get("content"):
                ttft = time.perf_counter() - began
    return {"ttft_s": ttft, "total_s": time.perf_counter() - began, "usage": usage}
