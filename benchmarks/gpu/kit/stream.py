"""One streamed greedy request of exactly ``max_tokens``, each token's arrival, its
logprobs when asked, and the tail a user feels; two answers compared."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from vllm_offload.bench.client import fixed_length_body


@dataclass(kw_only=True)
class Answer:
    """What came back: ``began`` (perf_counter at the request), each token's arrival in
    seconds after it (a chunk of several tokens gives them one time), and with logprobs
    the tokens, their logprobs and the top 5; ``refused``: the server's error instead."""

    began: float
    times: list[float] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[dict[str, float]] = field(default_factory=list)
    refused: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.times[0] if self.times else None

    @classmethod
    def from_json(cls, saved: dict[str, Any]) -> Answer:
        """The tokens, logprobs and top 5 of an answer as ``to_json`` (or
        ``stream_record``) saved them."""
        return cls(
            began=0.0,
            tokens=saved["tokens"],
            logprobs=saved["token_logprobs"],
            top=saved["top_logprobs"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "began_s": round(self.began, 5),  # perf_counter: CLOCK_MONOTONIC, as vLLM's logs
            "ttft_s": self.ttft_s,
            "tokens": self.tokens,
            "token_logprobs": self.logprobs,
            "top_logprobs": self.top,
            "times_s": [round(t, 5) for t in self.times],
            **({"refused": self.refused} if self.refused else {}),
            **(tail(self.times) or {}),
        }


def stream(
    base_url: str,
    prompt: list[int],
    max_tokens: int,
    *,
    logprobs: int = 0,
    model: str = "m",
    timeout_s: float = 1800,
    answer: Answer | None = None,
    extra: dict[str, Any] | None = None,
) -> Answer:
    """Greedy, exactly ``max_tokens``; vLLM's usage count in every chunk says how many
    tokens arrived (``logprobs`` > 0 also returns them, with their top ``logprobs``).
    ``answer``: filled as tokens arrive (another thread may watch it); ``extra``: more
    fields of the body."""
    body = (
        fixed_length_body(prompt, max_tokens, model)
        | {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        | (extra or {})
    )
    if logprobs:
        body["logprobs"] = logprobs
    if answer is None:
        answer = Answer(began=0.0)
    answer.began = time.perf_counter()
    with (
        httpx.Client(base_url=base_url, timeout=timeout_s) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        if response.status_code != 200:
            answer.refused = response.read().decode(errors="replace")[:300]
            return answer
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            count = (chunk.get("usage") or {}).get("completion_tokens") or 0
            if count > len(answer.times):
                now = time.perf_counter() - answer.began
                answer.times += [now] * (count - len(answer.times))
            for choice in chunk.get("choices") or []:
                lp = choice.get("logprobs") or {}
                answer.tokens += lp.get("tokens") or []
                answer.logprobs += lp.get("token_logprobs") or []
                answer.top += lp.get("top_logprobs") or []
    return answer


def nearest_rank(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank: the smallest value with at least q of them at or
    below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def tail(times: list[float]) -> dict[str, float] | None:
    """From the first token on: mean time per token ((last - first) / (tokens - 1), vLLM's
    bench TPOT), the median, p99 and worst gap between tokens."""
    if len(times) < 2:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return {
        "mean_tpot_s": (times[-1] - times[0]) / (len(times) - 1),
        "median_gap_s": statistics.median(gaps),
        "p99_gap_s": nearest_rank(gaps, 0.99),
        "max_gap_s": gaps[-1],
    }


def compare(answer: Answer, reference: Answer) -> dict[str, Any]:
    """Two greedy answers to one request: equal tokens, logprobs, top logprobs; the first
    token where they part, and the largest logprob difference."""
    parted = next(
        (
            n
            for n, (a, b) in enumerate(zip(answer.logprobs, reference.logprobs, strict=False))
            if a != b or answer.tokens[n] != reference.tokens[n]
        ),
        None,
    )
    return {
        "same_tokens": answer.tokens == reference.tokens,
        "same_logprobs": answer.logprobs == reference.logprobs,
        "same_top_logprobs": answer.top == reference.top,
        "first_difference": parted,
        "max_logprob_diff": max(
            (abs(a - b) for a, b in zip(answer.logprobs, reference.logprobs, strict=False)),
            default=None,
        ),
    }


def stream_record(
    http: httpx.Client,
    prompt: list[int],
    max_tokens: int,
    model: str = "m",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``stream`` with 5 logprobs a token to ``http``'s server, as the earlier experiments
    record it (their JSON keys): TTFT, the whole time, the median and min-max gap between
    tokens, the tokens, their logprobs and top 5. A refusal raises."""
    began = time.perf_counter()
    answer = stream(str(http.base_url), prompt, max_tokens, logprobs=5, model=model, extra=extra)
    if answer.refused:
        raise RuntimeError(f"the server refused the request: {answer.refused}")
    gaps = [b - a for a, b in itertools.pairwise(answer.times)]
    return {
        "ttft_s": answer.ttft_s,
        "total_s": time.perf_counter() - began,
        "tpot_median_s": statistics.median(gaps) if gaps else None,
        "tpot_min_max_s": [min(gaps), max(gaps)] if gaps else None,
        "tokens": answer.tokens,
        "token_logprobs": answer.logprobs,
        "top_logprobs": answer.top,
    }


def compare_records(answer: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """``compare`` of two answers recorded by ``stream_record``."""

    return compare(Answer.from_json(answer), Answer.from_json(reference))
