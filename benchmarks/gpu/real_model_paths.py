#!/usr/bin/env python3
"""Issue #39 item 3 on the GPU host: the default model (SmolLM2-135M-Instruct, from
`vllm-offload demo-model DIR`) answers testkit/real_reference.py's prompts through our paths
as through a plain all-GPU serve. Servers through `vllm-offload serve`, a config per arm
(OUT/<arm>.toml), eager, all up at once; greedy, NEW_TOKENS tokens (ignore_eos), 5 logprobs:

  gpu     --dtype (float32, as `serve` runs the default model), no CPU tier: the baseline
  tier    the native CPU tier, 16-token blocks and chunks, a --tier-pool-tokens GPU pool:
          each prompt cold, then per prompt fillers that push it out of the pool and the
          prompt again, a CPU-tier hit (vLLM's counters: tokens from the tier, none from
          the pool). (a) the hit answers as cold and as gpu
  switch  two [[models]] 'a', 'b' of the folder behind the front door, max_resident 1,
          sleep level 1: every prompt to 'a', one to 'b', every prompt to 'a' again.
          (b) 'a' answers as before and as gpu (the events say 'a' slept and woke)
  bf16    the model in bfloat16; fp8: the same, model.kv_cache_dtype = "fp8". (c) fp8
          against bf16 per prompt: equal tokens, the largest logprob gap (recorded, not
          judged; bf16 against gpu beside it, for scale)

(d) gpu's greedy tokens and top-k logprobs against the float32 transformers reference on
the CPU (testkit/real_reference.py's rule). Every comparison covers a prompt's steps before
the reference's first near-tie (MIN_MARGIN); a prompt that starts with one is left out.
Two answers are the same when those tokens are equal and each chosen token's logprob is
within SAME_LOGPROB_TOL. Control: each prompt with its question's first token changed
(inside the 32 tokens a CPU hit loads), on gpu: the same rule must call it different and
the reference rule find differences. Writes OUT/real_model_paths.json (answers, verdicts)
and each server's log; prints the verdicts; exit 1 unless every judged check passes.

Device command (after the vLLM 0.33.0 bundle is unpacked to /root/site with the plugin's
dist-info in /root/vo, as benchmarks/gpu/release.sh, and the model converted to
/root/smollm2 with STAGE=/root/stage, as .gpu/needle/sh/convert.sh does: the GGUF under
/root/stage/cache, the gguf package in /root/stage/gguf-site for the reference):

    export PYTHONPATH=/root/vo:$PWD:/root/site:/root/stage/gguf-site \
      VLLMOFFLOAD_CACHE=/root/stage/cache VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
      PYTHONUNBUFFERED=1; timeout -k 10 470 python3 benchmarks/gpu/real_model_paths.py \
      --model /root/smollm2 --out $OUT/paths 2>&1 | grep -v Warning | tail -40
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from kit.box import control  # the front door's control socket: models and events
from kit.stream import compare_records, stream_record  # one greedy request, compared

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # testkit/real_reference.py: the prompts and the near-tie rule
from testkit import real_reference as ref  # noqa: E402
from vllm_offload.bench.client import complete  # noqa: E402
from vllm_offload.bench.server_process import ServerProcess  # noqa: E402
from vllm_offload.config import parse, to_toml  # noqa: E402
from vllm_offload.upstream.client import VllmClient  # noqa: E402
from vllm_offload.upstream.metrics import CPU_TIER_HITS, GPU_PREFIX_HITS  # noqa: E402

KV_ELEMENTS_PER_TOKEN = 30 * 2 * 3 * 64  # layers x K,V x KV heads x head_dim
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "fp8": 1}
# Same GPU, same kernels: only the split between cached and computed tokens may differ
# (a CPU hit computes the last few prompt tokens, cold computes them all), which moves a
# float32 logprob in its last bits; a changed prompt token moves them by 0.8-2.3 nats
# (the reference, on the CPU), and the near-tie rule keeps steps whose lead is 0.3.
SAME_LOGPROB_TOL = 0.01
FILLERS = 3  # each 7/8 of the tier arm's pool: the first two already evict everything
TIER_BLOCK = 16  # tokens a block and a CPU chunk: a ~37-token prompt has 2 to load


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the converted model's folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="float32", help="model.dtype of gpu, tier, switch")
    parser.add_argument("--pool-tokens", type=int, default=16384, help="gpu's KV pool")
    parser.add_argument("--tier-pool-tokens", type=int, default=1024)
    parser.add_argument("--tier-gib", type=float, default=2.0)
    parser.add_argument("--utilization", type=float, default=0.12, help="each engine's")
    parser.add_argument("--start-timeout", type=float, default=330)
    parser.add_argument("--run-dir", type=Path, default=Path("/tmp/real-model-paths"))
    args = parser.parse_args(argv)
    if args.dtype not in ("float32", "bfloat16"):
        parser.error(f"--dtype {args.dtype}: float32 or bfloat16")
    return args


def arm_configs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each arm's deployment config (what `serve --config` reads)."""
    model = {"path": str(args.model), "dtype": args.dtype}
    fp8 = {"path": str(args.model), "dtype": "bfloat16", "kv_cache_dtype": "fp8"}

    def arm(kv: str, tokens: int, util: float = args.utilization, **kv_offload: Any) -> Any:
        pool = tokens * KV_ELEMENTS_PER_TOKEN * ELEMENT_BYTES[kv]
        return {
            "extra_args": ["--enforce-eager"],
            "gpu": {"memory_utilization": util, "kv_cache_memory_bytes": pool},
            "kv_offload": {"backend": "none", **kv_offload},
        }

    tier = {"backend": "native", "cpu_tier_gib": args.tier_gib}
    tier |= {"block_size": TIER_BLOCK, "cpu_chunk_tokens": TIER_BLOCK}
    residency = {"max_resident": 1, "idle": "sleep", "sleep_level": 1, "min_resident_s": 0.0}
    residency["runtime_dir"] = str(args.run_dir / "switch")
    return {
        "gpu": arm(args.dtype, args.pool_tokens) | {"model": model},
        "tier": arm(args.dtype, args.tier_pool_tokens, **tier) | {"model": model},
        # twice the share: the planner takes 3 GiB off it for the engine asleep
        "switch": arm(args.dtype, args.pool_tokens, 2 * args.utilization)
        | {"models": [model | {"served_name": n} for n in "ab"], "residency": residency},
        "bf16": arm("bfloat16", args.pool_tokens) | {"model": fp8 | {"kv_cache_dtype": "auto"}},
        "fp8": arm("fp8", args.pool_tokens) | {"model": fp8},
    }


def question_at(prompts: list[list[int]]) -> int:
    """The first position where the prompts differ: the question's first token (the chat
    template's system turn before it is shared)."""
    return next(i for i in range(min(map(len, prompts))) if len({p[i] for p in prompts}) > 1)


def changed_prompt(prompt: list[int], at: int) -> list[int]:
    """The control's prompt: the token at ``at`` replaced by the next id."""
    return [*prompt[:at], prompt[at] + 1, *prompt[at + 1 :]]


def same(answer: dict[str, Any], base: dict[str, Any], steps: int) -> dict[str, Any]:
    """compare_records() over the first ``steps`` tokens, and whether that makes them the same."""
    keys = ("tokens", "token_logprobs", "top_logprobs")
    found = compare_records(
        {k: answer[k][:steps] for k in keys}, {k: base[k][:steps] for k in keys}
    )
    found["steps"] = steps
    found["all_tokens_equal"] = answer["tokens"] == base["tokens"]
    gap = found["max_logprob_diff"] or 0.0
    found["same"] = found["same_tokens"] and gap <= SAME_LOGPROB_TOL
    return found


def pairs(answers: list[Any], bases: list[Any], stable: list[int]) -> list[dict[str, Any]]:
    return [
        same(a, b, n) | {"prompt": i}
        for i, (a, b, n) in enumerate(zip(answers, bases, stable, strict=True))
        if n > 0
    ]


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    """Each check's verdict from the recorded answers (an arm that failed fails its check)."""
    arms, stable, at = result["arms"], result["stable_steps"], result["question_at"]
    found: dict[str, Any] = {}
    for name, judge in CHECKS.items():
        try:
            found[name] = judge(arms, stable, at)
        except KeyError as exc:  # an arm it reads did not get that far
            errors = {n: a["error"] for n, a in arms.items() if "error" in a}
            found[name] = {"pass": False, "error": f"missing {exc}", "arm_errors": errors}
    return found


def judge_reference(arms: Any, stable: list[int], at: int) -> dict[str, Any]:
    rows = arms["gpu"]["reference"]
    compared = [i for i, n in enumerate(stable) if n > 0]
    return {
        "pass": len(compared) >= len(stable) // 2
        and all(not rows[i]["differences"] for i in compared),
        "compared": compared,
        "max_logprob_diff": [rows[i]["max_logprob_diff"] for i in compared],
    }


def judge_control(arms: Any, stable: list[int], at: int) -> dict[str, Any]:
    gpu = arms["gpu"]
    changed = pairs(gpu["changed"], gpu["answers"], stable)
    rows = gpu["reference"]
    return {
        "pass": bool(changed)
        and not any(p["same"] for p in changed)
        and all(rows[p["prompt"]]["changed_differences"] for p in changed),
        "changed_max_logprob_diff": [p["max_logprob_diff"] for p in changed],
    }


def judge_tier(arms: Any, stable: list[int], at: int) -> dict[str, Any]:
    tier, gpu = arms["tier"], arms["gpu"]["answers"]
    checks = pairs(tier["hit"], gpu, stable) + pairs(tier["hit"], tier["cold"], stable)
    loaded = all(h > at for h in tier["cpu_hit_tokens"]) and not any(tier["gpu_hit_tokens"])
    return {
        "pass": loaded and all(p["same"] for p in checks),
        "hits_from_cpu_tier": loaded,
        "max_logprob_diff": max((p["max_logprob_diff"] or 0.0 for p in checks), default=None),
    }


def judge_switch(arms: Any, stable: list[int], at: int) -> dict[str, Any]:
    switch = arms["switch"]
    checks = pairs(switch["after"], switch["before"], stable)
    checks += pairs(switch["after"], arms["gpu"]["answers"], stable)
    texts = [e["text"] for e in switch["events"]]  # "slept 'a'", "woke 'a'", maybe ": why"
    slept_woke = all(any(t.startswith(f"{how} 'a'") for t in texts) for how in ("slept", "woke"))
    return {"pass": slept_woke and all(p["same"] for p in checks), "slept_and_woke": slept_woke}


def judge_fp8(arms: Any, stable: list[int], at: int) -> dict[str, Any]:
    fp8 = pairs(arms["fp8"]["answers"], arms["bf16"]["answers"], stable)
    scale = pairs(arms["bf16"]["answers"], arms["gpu"]["answers"], stable)
    return {
        "pass": None,  # recorded, not judged: fp8 may differ
        "per_prompt": [{k: p[k] for k in FP8_KEYS} for p in fp8],
        "bf16_vs_gpu_max_logprob_diff": [p["max_logprob_diff"] for p in scale],
    }


FP8_KEYS = ("prompt", "same_tokens", "all_tokens_equal", "max_logprob_diff")
CHECKS = {
    "reference": judge_reference,
    "control": judge_control,
    "cpu_tier_hit": judge_tier,
    "sleep_wake": judge_switch,
    "fp8_kv": judge_fp8,
}


def ask_all(base_url: str, prompts: list[list[int]], model: str = "m") -> list[dict[str, Any]]:
    with httpx.Client(base_url=base_url, timeout=300) as http:
        return [stream_record(http, p, ref.NEW_TOKENS, model) for p in prompts]


def run_gpu(
    url: str, prompts: list[list[int]], changed: list[list[int]], answers: list[Any]
) -> dict[str, Any]:
    import openai

    arm: dict[str, Any] = {"answers": ask_all(url, prompts), "changed": ask_all(url, changed)}
    if not answers:
        return arm
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=300)
    arm["reference"] = []
    for prompt, other, expected in zip(prompts, changed, answers, strict=True):
        row: dict[str, Any] = {}  # the reference's answer against the server's to each
        for key, sent in (("", prompt), ("changed_", other)):
            greedy = ref.served_greedy(client, "m", sent)
            forced = ref.served_forced(client, "m", sent, expected.tokens)
            row[f"{key}greedy"] = greedy
            row[f"{key}differences"] = ref.differences(expected, greedy, forced)
            row[f"{key}max_logprob_diff"] = ref.max_logprob_diff(expected, forced)
        arm["reference"].append(row)
    return arm


def run_tier(url: str, prompts: list[list[int]], pool_tokens: int) -> dict[str, Any]:
    arm: dict[str, Any] = {"cold": ask_all(url, prompts), "hit": []}
    time.sleep(1)  # the last stores to the tier finish
    rng = random.Random(0)
    arm["cpu_hit_tokens"], arm["gpu_hit_tokens"] = [], []
    with httpx.Client(timeout=300) as http, VllmClient(url) as server:
        for prompt in prompts:
            for _ in range(FILLERS):
                filler = [rng.randrange(1000, 40000) for _ in range(pool_tokens * 7 // 8)]
                if not (sent := complete(http, url, filler, 1)).ok:  # then no eviction either
                    arm.setdefault("filler_errors", []).append(sent.error)
            before = server.metrics([CPU_TIER_HITS, GPU_PREFIX_HITS])
            arm["hit"] += ask_all(url, [prompt])
            after = server.metrics([CPU_TIER_HITS, GPU_PREFIX_HITS])
            for key, name in (("cpu_hit", CPU_TIER_HITS), ("gpu_hit", GPU_PREFIX_HITS)):
                arm[f"{key}_tokens"].append(after.get(name, 0.0) - before.get(name, 0.0))
    return arm


def run_switch(url: str, prompts: list[list[int]], run_dir: Path) -> dict[str, Any]:
    arm: dict[str, Any] = {"before": ask_all(url, prompts, "a")}
    seen = len(control(run_dir)["events"])
    arm["b"] = ask_all(url, prompts[:1], "b")
    arm["after"] = ask_all(url, prompts, "a")
    arm["events"] = control(run_dir)["events"][seen:]
    return arm


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoTokenizer

    from vllm_offload.model import real as real_model

    args.out.mkdir(parents=True, exist_ok=True)
    servers: dict[str, ServerProcess] = {}
    for name in ("switch", "gpu", "tier", "bf16", "fp8"):  # the front door's start is longest
        path = args.out / f"{name}.toml"
        path.write_text(to_toml(parse(arm_configs(args)[name])))
        servers[name] = ServerProcess(
            serve_args=["--config", str(path)],
            log_path=args.out / f"{name}.log",
            served_name=None if name == "switch" else "m",
        )
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    prompts = [ref.chat_ids(tokenizer, q) for q in ref.PROMPTS]
    at = question_at(prompts)
    changed = [changed_prompt(p, at) for p in prompts]
    options = {k: str(v) for k, v in vars(args).items()}
    result: dict[str, Any] = {"options": options, "question_at": at, "arms": {}}
    out = args.out / "real_model_paths.json"
    began = time.monotonic()
    try:
        for server in servers.values():
            server.start()
        answers: list[ref.Answer] = []
        try:  # while the servers start
            model = ref.reference_model(args.model, real_model.gguf_path())
            answers = [ref.greedy(model, p) for p in prompts]
        except Exception as exc:  # no near-tie rule: every step compared, (d) not run
            result["reference_error"] = repr(exc)
        result["reference"] = [{"tokens": a.tokens, "margins": a.margins} for a in answers]
        stable = [a.stable_steps() for a in answers]
        result["stable_steps"] = stable or [ref.NEW_TOKENS] * len(prompts)
        runs: dict[str, Callable[[str], dict[str, Any]]] = {
            "gpu": lambda url: run_gpu(url, prompts, changed, answers),
            "tier": lambda url: run_tier(url, prompts, args.tier_pool_tokens),
            "switch": lambda url: run_switch(url, prompts, args.run_dir / "switch"),
            "bf16": lambda url: {"answers": ask_all(url, prompts)},
            "fp8": lambda url: {"answers": ask_all(url, prompts)},
        }
        for name in runs:
            server = servers[name]
            try:
                healthy = server.wait_healthy(
                    max(1.0, began + args.start_timeout - time.monotonic())
                )
                result["arms"][name] = runs[name](server.base_url) | {"healthy_s": healthy}
            except Exception as exc:  # recorded: the other arms still run
                result["arms"][name] = {"error": repr(exc)}
            print(name, "done" if "error" not in result["arms"][name] else result["arms"][name])
            out.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        for server in servers.values():
            server.stop()
    result["verdict"] = verdicts(result)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, verdict in result["verdict"].items():  # the short summary; the rest in OUT
        word = {True: "PASS", False: "FAIL", None: "recorded"}[verdict["pass"]]
        print(f"{name:13} {word:8} {json.dumps(verdict)[:400]}")
    return 0 if all(v["pass"] is not False for v in result["verdict"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
