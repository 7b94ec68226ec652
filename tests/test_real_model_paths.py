"""benchmarks/gpu/real_model_paths.py's CPU side: its options, the config each arm serves
(planned by `serve --dry-run` for a declared 80 GiB GPU), where the control's changed
token sits, and the verdicts on recorded answers (the GPU run is elsewhere)."""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from vllm_offload.cli import main
from vllm_offload.config import parse, to_toml

SCRIPT = Path(__file__).parents[1] / "benchmarks/gpu/real_model_paths.py"


def load() -> ModuleType:
    return importlib.import_module("benchmarks.gpu.real_model_paths")


def test_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = load()
    args = paths.parse_args(["--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert (args.dtype, args.tier_pool_tokens, args.pool_tokens) == ("float32", 1024, 16384)
    with pytest.raises(SystemExit) as exit_:
        paths.parse_args(["--model", "m", "--out", "o", "--dtype", "float16"])
    assert exit_.value.code == 2
    assert "--dtype float16: float32 or bfloat16" in capsys.readouterr().err


def test_each_arm_serves_what_its_check_needs(
    real_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every arm's config is planned and accepted, and the command line it would run is
    the arm's: the tier's small pool of 16-token blocks with the native tier, fp8 KV on
    a bfloat16 model, two engines that sleep."""
    paths = load()
    args = paths.parse_args(["--model", str(real_dir), "--out", str(tmp_path)])
    argv: dict[str, str] = {}
    for name, data in paths.arm_configs(args).items():
        path = tmp_path / f"{name}.toml"
        path.write_text(to_toml(parse(data)))
        served = [] if name == "switch" else ["--model-served-name", "m"]
        flags = ["--dry-run", "--gpu-mem-gib", "80", "--ram-gib", "128", "--port", "8123"]
        assert main(["serve", "--config", str(path), *served, *flags]) == 0, name
        argv[name] = capsys.readouterr().out
    per_token = 30 * 2 * 3 * 64
    assert "--dtype=float32" in argv["gpu"] and "kv-transfer-config" not in argv["gpu"]
    assert f"--kv-cache-memory-bytes={16384 * per_token * 4}" in argv["gpu"]
    assert "OffloadingConnector" in argv["tier"] and "--block-size=16" in argv["tier"]
    assert f"--kv-cache-memory-bytes={1024 * per_token * 4}" in argv["tier"]
    assert '"block_size"' not in argv["tier"]  # the CPU chunk: one GPU block, not 256
    assert "--dtype=bfloat16" in argv["fp8"] and "--kv-cache-dtype=fp8" in argv["fp8"]
    assert "--dtype=bfloat16" in argv["bf16"] and "--kv-cache-dtype" not in argv["bf16"]
    assert argv["switch"].count("--enable-sleep-mode") == 2
    assert argv["switch"].count(f"--kv-cache-memory-bytes={16384 * per_token * 4}") == 2
    assert "--served-model-name=a" in argv["switch"] and "--served-model-name=b" in argv["switch"]


def test_the_changed_token_is_in_what_a_cpu_hit_loads(real_dir: Path) -> None:
    """The control changes the question's first token; a CPU hit loads every whole block
    before the prompt's last token: the changed token must be among them, or the control
    would say nothing about the loaded KV."""
    from transformers import AutoTokenizer

    from testkit import real_reference as ref

    paths = load()
    tokenizer = AutoTokenizer.from_pretrained(str(real_dir))
    prompts = [ref.chat_ids(tokenizer, q) for q in ref.PROMPTS]
    at = paths.question_at(prompts)
    assert len({tuple(p[:at]) for p in prompts}) == 1  # the shared system turn
    for prompt in prompts:
        loaded = (len(prompt) - 1) // paths.TIER_BLOCK * paths.TIER_BLOCK
        assert at < loaded, (at, loaded)
        changed = paths.changed_prompt(prompt, at)
        assert len(changed) == len(prompt) and [
            i for i, (a, b) in enumerate(zip(prompt, changed, strict=True)) if a != b
        ] == [at]


def answer(tokens: str, shift: float = 0.0) -> dict[str, Any]:
    """A streamed answer: one letter a token, logprob -1 each (+ shift on the last)."""
    logprobs = [-1.0] * len(tokens)
    logprobs[-1] += shift
    top = [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)]
    return {"tokens": list(tokens), "token_logprobs": logprobs, "top_logprobs": top}


def recorded() -> dict[str, Any]:
    """Three prompts; the reference's first near-tie after 4 steps, at once, never."""
    base = [answer("abcdef"), answer("ghijkl"), answer("mnopqr")]
    rows = [{"differences": [], "changed_differences": ["x"], "max_logprob_diff": 0.05}] * 3
    return {
        "question_at": 24,
        "stable_steps": [4, 0, 6],
        "arms": {
            "gpu": {
                "answers": base,
                "changed": [answer("abzzzz"), answer("zzzzzz"), answer("mnopqr", shift=0.5)],
                "reference": rows,
            },
            "tier": {
                "cold": copy.deepcopy(base),
                "hit": copy.deepcopy(base),
                "cpu_hit_tokens": [32.0] * 3,
                "gpu_hit_tokens": [0.0] * 3,
            },
            "switch": {
                "before": copy.deepcopy(base),
                "after": copy.deepcopy(base),
                "events": [{"text": t} for t in ("slept 'a'", "woke 'b'", "slept 'b'", "woke 'a'")],
            },
            "bf16": {"answers": copy.deepcopy(base)},
            "fp8": {"answers": [answer("abcdzz"), answer("ghzzzz"), answer("mnopqr", 0.3)]},
        },
    }


def test_verdicts_pass_on_equal_answers_and_report_fp8() -> None:
    paths = load()
    verdict = paths.verdicts(recorded())
    assert {k: v["pass"] for k, v in verdict.items()} == {
        "reference": True,
        "control": True,
        "cpu_tier_hit": True,
        "sleep_wake": True,
        "fp8_kv": None,
    }
    # Prompt 1 starts with a near-tie: left out; prompt 0's fp8 tokens differ only after
    # its 4 stable steps; prompt 2's last logprob moved 0.3 (of 6 steps compared).
    fp8 = verdict["fp8_kv"]["per_prompt"]
    assert [(p["prompt"], p["same_tokens"]) for p in fp8] == [(0, True), (2, True)]
    assert [p["max_logprob_diff"] for p in fp8] == [0.0, pytest.approx(0.3)]
    assert verdict["fp8_kv"]["bf16_vs_gpu_max_logprob_diff"] == [0.0, 0.0]


def test_verdicts_fail_where_the_paths_differ() -> None:
    paths = load()

    def judged(change: Any) -> dict[str, Any]:
        result = recorded()
        change(result["arms"])
        verdict: dict[str, Any] = paths.verdicts(result)
        return verdict

    def hit_token(arms: Any) -> None:
        arms["tier"]["hit"][2] = answer("mnopzz")

    def hit_logprob(arms: Any) -> None:  # past SAME_LOGPROB_TOL in a stable step
        arms["tier"]["hit"][0]["token_logprobs"][3] += 2 * paths.SAME_LOGPROB_TOL

    def no_cpu_hit(arms: Any) -> None:  # answered from the GPU pool: proves nothing
        arms["tier"]["cpu_hit_tokens"][1] = 0.0
        arms["tier"]["gpu_hit_tokens"][1] = 32.0

    def not_woken(arms: Any) -> None:  # 'a' never went away
        arms["switch"]["events"] = [{"text": "slept 'b'"}]

    def after_wake(arms: Any) -> None:
        arms["switch"]["after"][0] = answer("abczzz")

    def insensitive(arms: Any) -> None:  # the changed prompt answered as the original
        arms["gpu"]["changed"][2] = answer("mnopqr")

    def reference(arms: Any) -> None:
        arms["gpu"]["reference"] = [*arms["gpu"]["reference"][:2], {"differences": ["step 0"]}]

    def failed(arms: Any) -> None:
        arms["switch"] = {"error": "TimeoutError('not healthy')"}

    assert judged(hit_token)["cpu_tier_hit"]["pass"] is False
    assert judged(hit_logprob)["cpu_tier_hit"]["pass"] is False
    assert judged(no_cpu_hit)["cpu_tier_hit"] == {
        "pass": False,
        "hits_from_cpu_tier": False,
        "max_logprob_diff": 0.0,
    }
    assert judged(not_woken)["sleep_wake"] == {"pass": False, "slept_and_woke": False}
    assert judged(after_wake)["sleep_wake"]["pass"] is False
    assert judged(insensitive)["control"]["pass"] is False
    assert judged(reference)["reference"]["pass"] is False
    broken = judged(failed)
    assert broken["sleep_wake"]["pass"] is False
    assert broken["sleep_wake"]["arm_errors"] == {"switch": "TimeoutError('not healthy')"}
    assert broken["cpu_tier_hit"]["pass"] is True  # the other checks stand


def test_the_script_runs_its_help() -> None:
    import subprocess

    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--tier-pool-tokens" in out.stdout, out.stderr
