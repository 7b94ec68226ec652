#!/usr/bin/env python3
"""Issue #39: why vLLM answered "What is the capital of France?" unlike transformers on
the same weights. The default model through `vllm-offload serve` (vLLM CPU) in bfloat16
(compiled, as `make serve` runs, and eager) and in float32 (compiled), against a float32
transformers reference built from the GGUF: the chat answer (greedy) and the first
answer step's top-5 logprobs (the same chat-template token ids to all). Writes OUT (JSON).

    PYTHONPATH=. python benchmarks/real_model_dtype.py \
        --out benchmarks/results/real-model/capital-dtype-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import httpx

from testkit import real_reference as ref
from vllm_offload.bench.server_process import ServerProcess
from vllm_offload.model import real as real_model

QUESTION = "What is the capital of France?"


ARMS = {
    "bfloat16_compiled": ("bfloat16", []),
    "bfloat16_eager": ("bfloat16", ["--enforce-eager"]),
    "float32_compiled": ("float32", []),
}


def served(model: Path, arm: str, ids: list[int], scratch: Path) -> dict[str, Any]:
    dtype, extra = ARMS[arm]
    env = dict(os.environ, VLLM_CACHE_ROOT=str(scratch / arm))  # a fresh compile per arm
    server = ServerProcess(
        serve_args=["--model", str(model), "--model-dtype", dtype, "--", *extra],
        log_path=scratch / f"{arm}.log",
        env=env,
    )
    server.start()
    try:
        server.wait_healthy()
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            chat = (
                http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "temperature": 0,
                        "max_tokens": 24,
                        "messages": [{"role": "user", "content": QUESTION}],
                    },
                )
                .raise_for_status()
                .json()
            )
            first = (
                http.post(
                    "/v1/completions",
                    json={
                        "model": "m",
                        "prompt": ids,
                        "temperature": 0,
                        "max_tokens": 1,
                        "logprobs": 5,
                        "return_tokens_as_token_ids": True,
                    },
                )
                .raise_for_status()
                .json()
            )
    finally:
        server.stop()
    top = first["choices"][0]["logprobs"]["top_logprobs"][0]
    return {
        "answer": chat["choices"][0]["message"]["content"],
        "first_step_top5": {k.split(":")[1]: v for k, v in top.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model = real_model.ensure_default()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids = ref.chat_ids(tokenizer, QUESTION)
    expected = ref.greedy(ref.reference_model(model, real_model.gguf_path()), ids)
    result: dict[str, Any] = {
        "question": QUESTION,
        "prompt_ids": ids,
        "transformers_float32": {
            "answer": tokenizer.decode(expected.tokens, skip_special_tokens=True),
            "first_step_top5": {str(k): v for k, v in expected.top[0].items()},
            "first_step_margin_nats": expected.margins[0],
        },
    }
    with tempfile.TemporaryDirectory() as scratch:
        for arm in ARMS:
            result[f"vllm_cpu_{arm}"] = served(model, arm, ids, Path(scratch))
            print(arm, result[f"vllm_cpu_{arm}"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["transformers_float32"], indent=1))


if __name__ == "__main__":
    main()
