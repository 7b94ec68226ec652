"""The prompts the workloads send: made-up text or token ids of a chosen length."""

from __future__ import annotations

import random
from dataclasses import dataclass

from vllm_offload.bench.client import Prompt

# Token ids well inside any real vocabulary and clear of special tokens.
TOKEN_LOW, TOKEN_HIGH = 1000, 30000
WORDS = (
    "the",
    "cache",
    "holds",
    "blocks",
    "of",
    "tokens",
    "in",
    "host",
    "memory",
    "for",
    "later",
    "reuse",
    "by",
    "the",
    "server",
)


@dataclass(frozen=True, kw_only=True)
class PromptMaker:
    token_ids: bool
    vocab_high: int = TOKEN_HIGH

    def make(self, rng: random.Random, tokens: int) -> Prompt:
        """About ``tokens`` tokens: exact ids, or words (~1 token each)."""
        if self.token_ids:
            high = min(self.vocab_high, TOKEN_HIGH)
            return [rng.randrange(min(TOKEN_LOW, high // 2), high) for _ in range(tokens)]
        return " ".join(rng.choice(WORDS) for _ in range(tokens))

    def join(self, a: Prompt, b: Prompt) -> Prompt:
        if isinstance(a, list) and isinstance(b, list):
            return a + b
        return f"{a} {b}"
