"""The config's sections and their keys: types, bounds and the descriptions that feed
``--help`` and the docs. Values that reach vLLM's argv keep to narrow alphabets."""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vllm_offload.upstream import compat

Auto = Literal["auto"]


MAX_STRING_CHARS = 4096
# Bounds past any real machine: larger numbers only overflow the planner's arithmetic.
MAX_GIB = 1 << 20  # 1 PiB, for every *_gib key
MAX_BYTES = MAX_GIB << 30
MAX_TOKENS = 1 << 28  # 268M tokens, for max_model_len
# gpu.prefill_chunk_tokens: vLLM's smallest default chunk (a TPU's) to 16x an H100's;
# past it the activations of an 8B model alone take ~14 GiB.
PREFILL_CHUNK_RANGE = (256, 1 << 17)

# Values the launcher writes into vLLM's argv. vLLM's parser reads a token that starts with
# "-" as an option, and one that also holds a "." as a dotted JSON option that takes the
# next token as its value, so none of these may start with "-", and each keeps to the
# characters its use needs.
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,255}")
PARAM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]{0,255}")
HUB_PATTERN = re.compile(
    r"[A-Za-z0-9*?][A-Za-z0-9._*?-]{0,95}/[A-Za-z0-9*?][A-Za-z0-9._*?-]{0,95}"
    r"(@[A-Za-z0-9*?][A-Za-z0-9._/*?-]{0,127})?"
)
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_NAME = re.compile(rf"{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")


def _bounded_gib(value: float | str) -> float | str:
    if isinstance(value, float) and value > MAX_GIB:
        raise ValueError(f"must be at most {MAX_GIB} GiB (1 PiB); give a size a machine has")
    return value


def check_host(host: str) -> str:
    """An address to listen on: an IP address or a host name."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host and (len(host) > 253 or not HOST_NAME.fullmatch(host)):
            raise ValueError(
                "not an IP address or host name; e.g. 127.0.0.1, ::1, 0.0.0.0 or localhost"
            ) from None
    return host


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _plain_strings(cls, value: Any) -> Any:
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            if len(text) > MAX_STRING_CHARS:
                raise ValueError(f"longer than {MAX_STRING_CHARS} characters")
            # A control character (NUL, a newline: a folder's name forged journal lines)
            if any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
                raise ValueError(
                    "contains a control character (NUL, a newline, ...) or broken "
                    "Unicode; remove it"
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _reject_swap_space(cls, data: Any) -> Any:
        if isinstance(data, dict) and compat.SWAP_SPACE_KEY in data:
            raise ValueError(compat.SWAP_SPACE_FIX)
        return data


class ModelSection(_Section):
    path: str = Field(
        "",
        description="Local Hugging Face model directory (config.json + weights), or a "
        "Hugging Face repo id ('org/name', 'org/name@revision') fetched into the HF cache "
        "by `vllm-offload pull` (an existing folder of that name wins; write './org/name' "
        "for a folder). Empty: the built-in demo model.",
    )
    served_name: str = Field(
        "",
        description="Model name the API answers to. Empty: the repo id (org/name), or the "
        "directory's name.",
    )
    max_model_len: int | Auto = Field(
        "auto",
        description="Longest request (prompt + output) in tokens. 'auto': the largest that "
        "one request can hold in the GPU KV pool, capped at the model's limit.",
    )
    allow_long_max_model_len: bool = Field(
        False,
        description="Pass a max_model_len past the model's own limit (its config.json's "
        "max_position_embeddings and RoPE scaling, as vLLM derives it) on purpose, for a "
        "model trained or scaled past what its config says: sets vLLM's "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. Otherwise such a length is refused, as vLLM "
        "refuses it.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weight and activation dtype."
    )
    kv_cache_dtype: Literal["auto", "fp8", "fit"] = Field(
        "auto",
        description="KV cache element type: 'auto' (the model's dtype), 'fp8' (half the "
        "bytes per token, so twice the tokens in both tiers), or 'fit': fp8 only when the "
        "model's dtype cannot hold max_model_len x gpu.min_concurrent_requests tokens "
        "without offloading more weights.",
    )

    @model_validator(mode="after")
    def _positive_len(self) -> ModelSection:
        if isinstance(self.max_model_len, int) and self.max_model_len < 1:
            raise ValueError("max_model_len must be a positive number of tokens or 'auto'")
        return self

    @field_validator("max_model_len")
    @classmethod
    def _bounded_len(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value > MAX_TOKENS:
            raise ValueError(f"must be at most {MAX_TOKENS:,} tokens, or 'auto'")
        return value

    @field_validator("path")
    @classmethod
    def _path_is_no_option(cls, path: str) -> str:
        if path.startswith("-"):
            raise ValueError("must not start with '-'; give the folder's path (./-name)")
        return path

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, name: str) -> str:
        if name and not SERVED_NAME.fullmatch(name):
            raise ValueError(
                "must be up to 256 letters, digits and . _ : / @ + -, starting with a letter "
                "or digit (e.g. 'org/model-7b'); or '' for the model folder's name"
            )
        return name


class GpuSection(_Section):
    memory_utilization: float = Field(
        0.9,
        gt=0.0,
        le=1.0,
        description="Fraction of GPU memory vLLM may use (weights + activations + KV pool).",
    )
    kv_cache_memory_bytes: int | Auto = Field(
        "auto",
        description="Size the GPU KV pool exactly, in bytes, instead of from memory_utilization.",
    )
    min_concurrent_requests: int = Field(
        1,
        ge=1,
        le=4096,
        description="Full-length requests (model.max_model_len tokens each) the GPU KV pool "
        "must hold at once. With max_model_len a number and weights_offload.cpu_gib = "
        "'auto', the planner offloads the fewest weights that make room for them.",
    )
    prefill_chunk_tokens: int | Auto = Field(
        "auto",
        description="Most tokens vLLM computes in one step (vLLM --max-num-batched-tokens): "
        "a longer prompt is prefilled in chunks of this many. Larger: fewer steps per long "
        "prompt, and with kv_offload.host_extension_gib fewer copies of a spilled "
        "request's host blocks (they fall as 1/chunk); the cost is activation memory, "
        "about (3 x intermediate_size + 4 x hidden_size) x 2 bytes a token (an 8B model: "
        "~0.9 GiB at 8,192), which the planner takes from the GPU KV pool. 'auto': vLLM's "
        "own default (2,048; 8,192 on cards of 70 GiB or more but the A100; 16,384 from "
        "160 GiB), but 8,192 with a host extension and kv_offload.staged_prefill where the "
        "plan already counts its activations (dense models); otherwise vLLM's, and plan "
        "says why (a mixture of experts would pay for it from the pool).",
    )

    @model_validator(mode="after")
    def _positive_pool(self) -> GpuSection:
        if isinstance(self.kv_cache_memory_bytes, int) and self.kv_cache_memory_bytes < 1:
            raise ValueError("kv_cache_memory_bytes must be a positive number of bytes or 'auto'")
        return self

    @field_validator("prefill_chunk_tokens")
    @classmethod
    def _chunk_in_range(cls, value: int | str) -> int | str:
        low, high = PREFILL_CHUNK_RANGE
        if isinstance(value, int) and not low <= value <= high:
            raise ValueError(f"must be {low:,} to {high:,} tokens, or 'auto'")
        return value

    @field_validator("kv_cache_memory_bytes")
    @classmethod
    def _bounded_pool(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value > MAX_BYTES:
            raise ValueError(f"must be at most {MAX_BYTES} bytes (1 PiB), or 'auto'")
        return value


class ParallelSection(_Section):
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs per model replica.")
    pipeline_parallel_size: int = Field(
        1, ge=1, le=64, description="Pipeline stages (across hosts with Ray)."
    )
    distributed_executor_backend: Literal["auto", "mp", "ray", "uni"] = Field(
        "auto",
        description="How vLLM runs its workers: 'mp' on one host, 'ray' to span hosts, "
        "'auto' lets vLLM choose.",
    )

    @property
    def ranks(self) -> int:
        """The GPUs one replica takes, each holding a share of the weights."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


class ServerSection(_Section):
    host: str = Field("127.0.0.1", description="Address the OpenAI API listens on.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the OpenAI API.")
    api_key_file: str = Field(
        "",
        description="File holding the API key clients must send. Empty: no key. "
        "The key reaches vLLM through its environment, never its command line.",
    )
    reproducible: bool = Field(
        True,
        description="The same greedy answer (tokens and logprobs) after every start on a "
        "GPU: kernels vLLM would choose by timing them at start-up are chosen by rule "
        "(Inductor's deterministic mode, the first config of vLLM's Triton autotuners, no "
        "FlashInfer autotuning). false: vLLM's choice by timing, which can move an answer "
        "by one rounding step between cold starts.",
    )

    _address = field_validator("host")(check_host)


class ManagerSection(_Section):
    model_roots: list[str] = Field(
        default_factory=list,
        description="Directories the manager lists models from (and the only places a "
        "model may be chosen from). Empty: each configured model's parent directory. Set "
        "in the file only: the manager's API cannot change [manager].",
    )
    api_extra_args: list[str] = Field(
        default_factory=list,
        description="vLLM flags the manager's API may put into extra_args beyond its "
        "built-in tuning flags (e.g. '--trust-remote-code', which runs the model folder's "
        "code). Set in the file only.",
    )
    wedge_after_s: float = Field(
        120.0,
        ge=10,
        le=86400,
        description="Seconds with requests waiting or running and no progress (no token "
        "generated, no prompt finished, the GPU KV cache unchanged) before the manager "
        "calls the server wedged (time the manager watched: a gap of over 5 s between its "
        "polls counts as 5 s); /health stays 200 in that state. Set in the file only.",
    )
    restart_wedged: bool = Field(
        False,
        description="Restart a wedged server automatically (at most "
        "restart_wedged_per_hour times an hour); false: the page offers a restart. Set in "
        "the file only.",
    )
    restart_wedged_per_hour: int = Field(
        3, ge=1, le=60, description="Most automatic restarts of a wedged server per hour."
    )
    stalled_load_after_s: float = Field(
        60.0,
        ge=5,
        le=86400,
        description="Seconds requests may wait on a KV load from the CPU tier without a "
        "break before the manager reports stalled loads (vLLM puts no time limit on them).",
    )
    hub_models: list[str] = Field(
        default_factory=list,
        description="Hugging Face repo ids the manager's API may name as a model and fetch "
        "into the manager's HF cache, as patterns ('Qwen/*', 'meta-llama/Llama-3.2-1B-"
        "Instruct'), each the repo's default branch only unless it names revisions too "
        "('org/name@v1.0', 'Qwen/*@main'; anyone can open a pull-request ref on the public "
        "hub, so 'org/*@*' allows those too). Empty: none (a hub id is named in the file "
        "and fetched with `vllm-offload pull`). Set in the file only.",
    )

    @field_validator("hub_models")
    @classmethod
    def _hub_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not HUB_PATTERN.fullmatch(pattern):
                raise ValueError(
                    f"{pattern!r} is not a repo id pattern (org/name or org/name@revision, "
                    "'*' and '?' allowed)"
                )
        return patterns
