"""benchmarks/gpu/needle.py's CPU side: the prompt it sends (the GPU run is elsewhere)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).parents[1] / "benchmarks/gpu/needle.py"


def load() -> ModuleType:
    return importlib.import_module("benchmarks.gpu.needle")


def test_prompt_is_real_text_with_the_needle_early(real_dir: Path) -> None:
    from transformers import AutoTokenizer

    needle = load()
    tokenizer = AutoTokenizer.from_pretrained(str(real_dir))
    paragraphs = needle.prose()
    assert len(paragraphs) > 50 and not any(p.startswith(("#", "|", "```")) for p in paragraphs)
    assert not any("key" in p.lower() for p in paragraphs)  # no rival to the pass key
    ids = needle.build_prompt(tokenizer, paragraphs, prompt_tokens=7000, needle_at=0.05)
    assert 6500 <= len(ids) <= 7000
    text = tokenizer.decode(ids)
    at = text.index(needle.NEEDLE.format(key=needle.KEY))
    assert 0 < at < len(text) * 0.1  # early, after some real text
    assert text.endswith("\n\n" + needle.QUESTION)
    control = needle.build_prompt(
        tokenizer, paragraphs, prompt_tokens=7000, needle_at=0.05, key=needle.CONTROL_KEY
    )
    assert needle.KEY not in tokenizer.decode(control)
    assert len(control) == len(ids)  # the same haystack, another key of the same length


def test_script_parses_its_options() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--small-pool-tokens" in out.stdout, out.stderr


def test_the_needle_is_found_where_it_sits_and_placed_in_host_blocks(real_dir: Path) -> None:
    """The run says whether the needle's KV was in host RAM: its token span, and the split
    patch 0006 logged (a 4,096-token GPU part of 32 blocks, the null block first)."""
    from transformers import AutoTokenizer

    needle = load()
    tokenizer = AutoTokenizer.from_pretrained(str(real_dir))
    paragraphs = needle.prose()
    split = {"gpu_blocks": 32, "gpu_tokens": 4096, "host_tokens": 8192}
    for at, in_host in ((0.05, False), (0.8, True)):
        ids = needle.build_prompt(tokenizer, paragraphs, prompt_tokens=7000, needle_at=at)
        first, last = needle.needle_span(tokenizer, ids)
        text = needle.NEEDLE.format(key=needle.KEY)
        assert text in tokenizer.decode(ids[first:last])  # exactly its tokens
        assert text not in tokenizer.decode(ids[first + 1 : last])
        assert text not in tokenizer.decode(ids[: last - 1])
        assert needle.in_host_blocks((first, last), split) is in_host
    assert needle.in_host_blocks((3968, 3990), split) is True  # the first host block's first row
    assert needle.in_host_blocks((3967, 3990), split) is False
    assert needle.in_host_blocks((5000, 5020), None) is None  # no split logged
