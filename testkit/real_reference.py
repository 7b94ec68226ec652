"""A float32 transformers reference for the default model, built from the GGUF file by
transformers' own GGUF reader (not by real_model.py), and the rule that compares a
server's greedy answer with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Fixed prompts (chat turns); which are stable enough to compare is decided by MIN_MARGIN.
PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "What is 2 + 2?",
    "Write one sentence about the sea.",
    "What color is the sky on a clear day?",
    "Translate 'good morning' into French.",
    "Who wrote Romeo and Juliet?",
    "List the days of the week.",
)
NEW_TOKENS = 16
TOP_K = 5
# How far a served top-k logprob may sit from the reference's. The server runs float32
# too (config.json) on the bfloat16-rounded weights (8 mantissa bits: each weight moves by
# up to 0.2%); on these prompts the largest gap seen was 0.09 nats (bfloat16 compute: 0.22).
MAX_LOGPROB_DIFF = 0.15
# A step whose top token leads the second by less than this is a near-tie: if each of the
# two logprobs may move by MAX_LOGPROB_DIFF, only a lead over twice that cannot flip.
MIN_MARGIN = 2 * MAX_LOGPROB_DIFF


@dataclass(frozen=True, kw_only=True)
class Answer:
    tokens: list[int]
    top: list[dict[int, float]]  # per step: token id -> logprob, the TOP_K best
    margins: list[float]  # per step: the top-1/top-2 lead, in nats (reference only)

    def stable_steps(self) -> int:
        """How many steps the greedy path is determined by the model alone: those before
        the first near-tie. A prompt whose first step is a near-tie is left out."""
        return next((i for i, m in enumerate(self.margins) if m < MIN_MARGIN), len(self.margins))


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def reference_model(model_dir: Path, gguf_file: Path) -> Any:
    """LlamaForCausalLM in float32 with the GGUF's weights as transformers converts them."""
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    model = LlamaForCausalLM(AutoConfig.from_pretrained(model_dir)).float().eval()
    tensors = load_gguf_checkpoint(gguf_file, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict(tensors, strict=False)  # lm_head is tied to the embedding
    model.tie_weights()
    return model


def with_llama_cpp_rows(model: Any) -> Any:
    """A copy of ``model`` whose q/k rows are in llama.cpp's order: the wrong-RoPE control."""
    import copy

    import torch

    from vllm_offload.model.real import HEADS, KV_HEADS

    wrong = copy.deepcopy(model)
    for layer in wrong.model.layers:
        for proj, heads in ((layer.self_attn.q_proj, HEADS), (layer.self_attn.k_proj, KV_HEADS)):
            proj.weight.data = torch.from_numpy(permute_rows(proj.weight.data.numpy(), heads))
    return wrong


def permute_rows(weight: Any, heads: int) -> Any:
    """llama.cpp's q/k row order (the inverse of real_model.unpermute_rows)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def greedy(model: Any, prompt_ids: list[int]) -> Answer:
    """Up to NEW_TOKENS argmax steps, ending after the model's end-of-turn token."""
    import torch

    ids, past = torch.tensor([prompt_ids]), None
    tokens: list[int] = []
    top: list[dict[int, float]] = []
    margins: list[float] = []
    with torch.no_grad():
        while len(tokens) < NEW_TOKENS and model.config.eos_token_id not in tokens:
            out = model(ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            best = torch.topk(torch.log_softmax(out.logits[0, -1].double(), dim=-1), TOP_K)
            top.append(dict(zip(best.indices.tolist(), best.values.tolist(), strict=True)))
            margins.append(float(best.values[0] - best.values[1]))
            tokens.append(int(best.indices[0]))
            ids = best.indices[:1].view(1, 1)
    return Answer(tokens=tokens, top=top, margins=margins)


def served_greedy(client: Any, model: str, prompt_ids: list[int]) -> list[int]:
    """The server's own greedy answer (it ends at the end-of-turn token, as greedy())."""
    out = client.completions.create(
        model=model,
        prompt=prompt_ids,
        temperature=0,
        max_tokens=NEW_TOKENS,
        logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )
    return [int(t.split(":", 1)[1]) for t in out.choices[0].logprobs.tokens]


def served_forced(client: Any, model: str, prompt_ids: list[int], answer: list[int]) -> Answer:
    """The server's top-k logprobs at each step of ``answer`` given the reference's own
    earlier tokens (prompt logprobs of prompt + answer): every step is compared in the
    same context, near-ties included."""
    out = client.completions.create(
        model=model,
        prompt=prompt_ids + answer,
        temperature=0,
        max_tokens=1,
        extra_body={"prompt_logprobs": TOP_K},
    )
    steps = out.choices[0].prompt_logprobs[len(prompt_ids) :]
    top = [{int(t): v["logprob"] for t, v in step.items() if v["rank"] <= TOP_K} for step in steps]
    return Answer(tokens=[max(s, key=s.__getitem__) for s in top], top=top, margins=[])


def differences(expected: Answer, greedy_tokens: list[int], forced: Answer) -> list[str]:
    """Why the served answers are not the reference's (empty: they are): its greedy tokens
    over the stable steps; under the reference's prefix, its top token at every step that
    is no near-tie; and every shared top-k logprob within MAX_LOGPROB_DIFF."""
    found = []
    stable = expected.stable_steps()
    if greedy_tokens[:stable] != expected.tokens[:stable]:
        found.append(f"greedy {greedy_tokens[:stable]} != reference {expected.tokens[:stable]}")
    for step, want in enumerate(expected.tokens):
        have = forced.top[step]
        if expected.margins[step] >= MIN_MARGIN and forced.tokens[step] != want:
            found.append(f"step {step}: top token {forced.tokens[step]}, reference {want}")
        for token, logprob in expected.top[step].items():
            if token in have and abs(have[token] - logprob) > MAX_LOGPROB_DIFF:
                found.append(f"step {step} token {token}: {have[token]:.3f} vs {logprob:.3f}")
    return found


def max_logprob_diff(expected: Answer, forced: Answer) -> float:
    """The largest gap between shared top-k logprobs (what MAX_LOGPROB_DIFF bounds)."""
    return max(
        (
            abs(have[t] - lp)
            for want, have in zip(expected.top, forced.top, strict=True)
            for t, lp in want.items()
            if t in have
        ),
        default=0.0,
    )
