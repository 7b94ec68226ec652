"""The default model through a real `vllm-offload serve` (vLLM CPU) answers as a float32
transformers reference built from the GGUF by transformers' own reader: greedy tokens
over the stable steps, the top token at every step that is no near-tie, top-k logprobs
within testkit/real_reference.py's tolerance. Two controls show the check can fail: the
prompt shifted by one token, and a reference whose q/k rows keep llama.cpp's order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from testkit import real_reference as ref
from testkit.server import Server
from vllm_offload.model import real as real_model

pytestmark = pytest.mark.e2e
NAME = "smollm2"


@pytest.fixture(scope="module")
def server(real_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`serve` with no model, as `make serve` runs it: the default model, in float32."""
    scratch = tmp_path_factory.mktemp("real")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLMOFFLOAD_CACHE": str(real_dir.parent)}
    srv = Server(["--model-served-name", NAME, "--", "--enforce-eager"], scratch, env=env)
    srv.start()
    assert "dtype=torch.float32," in srv.log_path.read_text()  # vLLM's engine config line
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", timeout=120)


@pytest.fixture(scope="module")
def prompts(real_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(real_dir))
    return [ref.chat_ids(tokenizer, question) for question in ref.PROMPTS]


@pytest.fixture(scope="module")
def reference(real_dir: Path) -> Any:
    return ref.reference_model(real_dir, real_model.gguf_path())


def check(client: openai.OpenAI, model: Any, prompt: list[int], sent: list[int]) -> list[str]:
    """The reference's answer to ``prompt`` against the server's to ``sent``."""
    expected = ref.greedy(model, prompt)
    forced = ref.served_forced(client, NAME, sent, expected.tokens)
    return ref.differences(expected, ref.served_greedy(client, NAME, sent), forced)


def test_served_model_answers_as_the_reference(
    client: openai.OpenAI, reference: Any, prompts: list[list[int]]
) -> None:
    answers = [ref.greedy(reference, prompt) for prompt in prompts]
    compared = [a for a in answers if a.stable_steps() > 0]
    assert len(compared) >= len(prompts) // 2, "too few prompts start without a near-tie"
    gaps = []
    for prompt, expected in zip(prompts, answers, strict=True):
        forced = ref.served_forced(client, NAME, prompt, expected.tokens)
        greedy = ref.served_greedy(client, NAME, prompt)
        assert ref.differences(expected, greedy, forced) == [], prompt
        gaps.append(ref.max_logprob_diff(expected, forced))
    print(f"largest top-k logprob gap per prompt: {[round(g, 3) for g in gaps]}")


def test_a_prompt_shifted_by_one_token_fails(
    client: openai.OpenAI, reference: Any, prompts: list[list[int]]
) -> None:
    for prompt in prompts[:2]:
        assert check(client, reference, prompt, prompt[1:]), prompt


def test_a_wrong_rope_permutation_fails(
    client: openai.OpenAI, reference: Any, prompts: list[list[int]]
) -> None:
    wrong = ref.with_llama_cpp_rows(reference)
    assert any(check(client, wrong, prompt, prompt) for prompt in prompts[:2])


def test_chat_answers_in_english(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=NAME,
        temperature=0,
        max_tokens=24,
        messages=[{"role": "user", "content": "Name three primary colors."}],
    )
    text = (out.choices[0].message.content or "").lower()
    assert all(color in text for color in ("red", "blue", "yellow")), text
