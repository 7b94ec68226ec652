#!/usr/bin/env python3
"""Issue #39 on the GPU host: a needle in ~7,000 tokens of real text, answered by the
default model (SmolLM2-135M-Instruct, `vllm-offload demo-model DIR`) through `vllm-offload
serve`, with the GPU KV pool shrunk so the prompt spills into the host extension, against
a pool that holds it.

The haystack is this repository's own prose (README.md and docs/, code blocks and tables
dropped: real English a person can read), cut to --prompt-tokens; the needle, a pass key
("The pass key is 71432. Remember it. ..."), sits --needle-at of the way in (early: its
KV lands in the GPU part of the shrunk pool, and the answer's attention must find it past
the host part); the prompt ends "What is the pass key? The pass key is" (a plain
completion: asked in the chat template, or as a question about a made-up fact, this 135M
model missed the needle at 7,000 tokens on vLLM CPU, 2026-11-25, while it copied 4 of 5
five-digit keys this way, 58216 not; with prose() as now, both keys below were copied
in float32 and in bfloat16, eager, on vLLM CPU). Arms, all up at once:

  big     a GPU pool of --big-pool-tokens (holds the prompt), no extension
  spill   a GPU pool of --small-pool-tokens + --extension-gib of host RAM. Patch 0006
          splits the pool on 2 MiB granules of every layer's region: for this model
          (768 KV bytes per token and layer in bfloat16) that is every 8,192 tokens, its
          whole context, so the run is float32 (every 4,096: `plan` shows 4,096 tokens
          on the GPU, the rest of the prompt in host RAM), as `serve` runs it anyway
  control big, the same haystack with another key (CONTROL_KEY): the answer must follow
          it, or naming the key would prove nothing about reading the needle

Correct: the spill arm's greedy answer names the key and its tokens equal big's (its
logprobs may differ in the last bits: the attention reads other blocks). The verdict says
whether the needle's KV sat in host RAM (its token span against the logged split): at
--needle-at 0.8 it does. Staged prefill (issue #41) is vLLM's FlashAttention, which runs
in 16 bits only: float32 reads the host blocks in place. To go through it, run bfloat16
with the split at 8,192 tokens and a longer prompt, past the model's 8,192 positions
(--dtype bfloat16 --max-model-len 12288 --prompt-tokens 10000 --small-pool-tokens 8192,
on a copy of the folder with max_position_embeddings 12288): the check there is the same
answer as big's, the key itself may be lost past the length the model was trained to. Writes
OUT/needle.json (answers, tokens, max logprob gap, the pool split from the log) and each
server's log. The model folder (270 MB) is more than one carry: tar it, `split -b 55M`,
send one part per call (appending under /root/stage), as the vLLM bundle.

    benchmarks/gpu/needle.py --model DIR --out DIR
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from kit import options
from kit.model import split_line  # patch 0006's log line: the GPU and host parts

REPO = Path(__file__).resolve().parents[2]
KEY, CONTROL_KEY = "71432", "86415"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"
LAYERS = 30
KV_ELEMENTS_PER_TOKEN = LAYERS * 2 * 3 * 64  # layers x K,V x KV heads x head_dim
MODEL_LIMIT = 8192  # max_position_embeddings: max_model_len 'auto'


def prose(root: Path = REPO) -> list[str]:
    """The paragraphs of README.md and docs/**/*.md (sorted), without code blocks,
    tables, headings or HTML: running English text. Paragraphs that say "key" are left
    out: with the API key and KV key paragraphs in, the model answered with one of
    those ("`vllm-offload-key-...`") instead of the pass key."""
    paragraphs: list[str] = []
    for path in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
        for block in re.split(r"\n\s*\n", text):
            lines = [ln.strip() for ln in block.strip().splitlines()]
            paragraph = " ".join(lines)
            if (
                lines
                and not any(ln.startswith(("#", "|", "<", "    ")) for ln in lines)
                and "key" not in paragraph.lower()
            ):
                paragraphs.append(paragraph)
    return paragraphs


def build_prompt(
    tokenizer: Any, paragraphs: list[str], *, prompt_tokens: int, needle_at: float, key: str = KEY
) -> list[int]:
    """Token ids: paragraphs filling ~prompt_tokens, the needle as its own paragraph after
    ``needle_at`` of them, then the question (a completion, no chat template)."""
    needle = NEEDLE.format(key=key)
    budget = prompt_tokens - len(tokenizer("\n\n" + needle + "\n\n" + QUESTION)["input_ids"])
    chosen: list[str] = []
    used = 0
    for paragraph in paragraphs:  # in order, skipping those that would overflow
        cost = len(tokenizer("\n\n" + paragraph)["input_ids"])
        if used + cost <= budget:
            chosen.append(paragraph)
            used += cost
    chosen.insert(round(len(chosen) * needle_at), needle)
    return list(tokenizer("\n\n".join(chosen) + "\n\n" + QUESTION)["input_ids"])


def ask(base_url: str, prompt: list[int], max_tokens: int, model: str = "m") -> dict[str, Any]:
    """Greedy, 5 logprobs a token; the text and the token ids."""
    import httpx

    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": 5,
        "return_tokens_as_token_ids": True,
    }
    with httpx.Client(base_url=base_url, timeout=900) as http:
        choice = http.post("/v1/completions", json=body).raise_for_status().json()["choices"][0]
    lp = choice["logprobs"]
    return {"text": choice["text"], "tokens": lp["tokens"], "token_logprobs": lp["token_logprobs"]}


def needle_span(tokenizer: Any, prompt: list[int], key: str = KEY) -> tuple[int, int]:
    """[first, last) token positions of the needle in ``prompt``: the shortest prefix
    whose text holds the whole needle ends it (bisection), its own token count starts it."""
    needle = NEEDLE.format(key=key)
    low, high = 0, len(prompt)
    while low < high:
        mid = (low + high) // 2
        if needle in tokenizer.decode(prompt[:mid]):
            high = mid
        else:
            low = mid + 1
    return low - len(tokenizer(needle, add_special_tokens=False)["input_ids"]), low


def in_host_blocks(span: tuple[int, int], split: dict[str, int] | None) -> bool | None:
    """Whether the needle's KV sits in the host extension: a fresh server's first request
    takes the pool's blocks in order after the null block, so its positions from
    (GPU blocks - 1) x block size on are in host RAM."""
    if not split:
        return None
    block = split["gpu_tokens"] // split["gpu_blocks"]
    return span[0] >= split["gpu_tokens"] - block


def main() -> None:
    parser = options.parser(__doc__, extension_gib=1.0)
    parser.add_argument("--model", type=Path, required=True, help="the default model's folder")
    parser.add_argument("--prompt-tokens", type=int, default=7000)
    parser.add_argument("--needle-at", type=float, default=0.05)
    parser.add_argument("--big-pool-tokens", type=int, default=16384)
    parser.add_argument("--small-pool-tokens", type=int, default=4096)
    parser.add_argument("--answer-tokens", type=int, default=12)
    split = "bfloat16 splits the pool only at 0 or 8,192 tokens"
    parser.add_argument("--dtype", default="float32", help=f"model.dtype ({split})")
    parser.add_argument(
        "--max-model-len",
        type=int,
        help="model.max_model_len (bfloat16's split at 8,192 needs a longer prompt: "
        "FlashAttention, so staged prefill, runs only in 16 bits); past the model's 8,192 "
        "positions, give a copy of the folder whose config.json's max_position_embeddings "
        "covers it (vLLM sizes its RoPE table from it)",
    )
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from vllm_offload.bench.server_process import ServerProcess

    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    paragraphs = prose()
    prompts = {
        key: build_prompt(
            tokenizer,
            paragraphs,
            prompt_tokens=args.prompt_tokens,
            needle_at=args.needle_at,
            key=key,
        )
        for key in (KEY, CONTROL_KEY)
    }
    common = [
        "--model",
        str(args.model),
        "--model-dtype",
        args.dtype,
        "--gpu-memory-utilization",
        "0.3",
        "--kv-offload-backend",
        "native",
        "--kv-offload-cpu-tier-gib",
        "2",
    ]
    if args.max_model_len:
        common += ["--model-max-model-len", str(args.max_model_len)]
    kv_bytes_per_token = KV_ELEMENTS_PER_TOKEN * (4 if args.dtype == "float32" else 2)
    # Staged prefill's scratch, one layer of the longest request, comes out of an extended
    # pool (plan/staging.py): the spill pool carries it, or its GPU part drops below one
    # mapping step and the plan refuses it.
    scratch = (args.max_model_len or MODEL_LIMIT) * kv_bytes_per_token // LAYERS
    pools = {"big": args.big_pool_tokens * kv_bytes_per_token}
    pools["spill"] = args.small_pool_tokens * kv_bytes_per_token + scratch
    extension = {"big": [], "spill": ["--kv-offload-host-extension-gib", str(args.extension_gib)]}
    servers = {
        name: ServerProcess(
            serve_args=[
                *common,
                "--gpu-kv-cache-memory-bytes",
                str(pool_bytes),
                *extension[name],
                "--",
                "--enforce-eager",
            ],
            log_path=args.out / f"{name}.log",
        )
        for name, pool_bytes in pools.items()
    }
    result: dict[str, Any] = {
        "options": {k: str(v) for k, v in vars(args).items()},
        "prompt_tokens": len(prompts[KEY]),
        "needle_tokens": needle_span(tokenizer, prompts[KEY]),
        "needle": NEEDLE,
        "question": QUESTION,
        "arms": {},
    }
    try:
        for server in servers.values():
            server.start()
        for name, server in servers.items():
            arm: dict[str, Any] = {"healthy_s": server.wait_healthy()}
            arm["split"] = split_line(server.log_path.read_text(errors="replace"))
            arm["answer"] = ask(server.base_url, prompts[KEY], args.answer_tokens)
            result["arms"][name] = arm
        control = ask(servers["big"].base_url, prompts[CONTROL_KEY], args.answer_tokens)
        result["arms"]["control"] = {"answer": control}
    finally:
        for server in servers.values():
            server.stop()
    big, spill = (result["arms"][n]["answer"] for n in ("big", "spill"))
    result["verdict"] = {
        "big_names_key": KEY in big["text"],
        "spill_names_key": KEY in spill["text"],
        "spill_same_tokens_as_big": spill["tokens"] == big["tokens"],
        "needle_in_host_blocks": in_host_blocks(
            result["needle_tokens"], result["arms"]["spill"]["split"]
        ),
        "max_logprob_gap": max(
            (
                abs(a - b)
                for a, b in zip(spill["token_logprobs"], big["token_logprobs"], strict=False)
            ),
            default=None,
        ),
        "control_names_its_key": CONTROL_KEY in control["text"] and KEY not in control["text"],
    }
    (args.out / "needle.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["verdict"], indent=1))


if __name__ == "__main__":
    main()
