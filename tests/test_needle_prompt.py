"""benchmarks/gpu/needle.py's CPU side: the prompt it sends (the GPU run is elsewhere)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).parents[1] / "benchmarks/gpu/needle.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("needle", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
