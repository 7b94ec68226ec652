"""Streaming completions over HTTP, timed: TTFT, TPOT, output tokens, errors."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import httpx

Prompt = str | list[int]


@dataclass(frozen=True, kw_only=True)
class RequestResult:
    ok: bool
    ttft_s: float | None
    latency_s: float
    output_tokens: int
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tpot_s": self.tpot_s}


def fixed_length_body(prompt: Prompt, max_tokens: int, model: str = "m") -> dict[str, Any]:
    """A streamed greedy completion of exactly ``max_tokens`` (ignore_eos): every answer to
    one prompt is as long as every other, whatever the weights make of it."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
    }


def complete(
    client: httpx.Client, base_url: str, prompt: Prompt, max_tokens: int, timeout_s: float = 300
) -> RequestResult:
    """One streamed completion with a fixed output length (ignore_eos)."""
    body = fixed_length_body(prompt, max_tokens) | {"stream_options": {"include_usage": True}}
    began = time.perf_counter()
    ttft = None
    tokens = 0
    try:
        with client.stream(
            "POST", base_url + "/v1/completions", json=body, timeout=timeout_s
        ) as response:
            if response.status_code != 200:
                detail = response.read().decode(errors="replace")[:300]
                return RequestResult(
                    ok=False,
                    ttft_s=None,
                    latency_s=time.perf_counter() - began,
                    output_tokens=0,
                    error=f"HTTP {response.status_code}: {detail}",
                )
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and ttft is None:
                    ttft = time.perf_counter() - began
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestResult(
            ok=False,
            ttft_s=ttft,
            latency_s=time.perf_counter() - began,
            output_tokens=tokens,
            error=repr(exc),
        )
    return RequestResult(
        ok=True, ttft_s=ttft, latency_s=time.perf_counter() - began, output_tokens=tokens
    )
