"""Several models in one config: ``[[models]]`` entries (each a ``[model]`` section of its
own, and optionally its own ``gpu``, ``kv_offload``, ``weights_offload`` keys and
``extra_args``, over the file's shared sections), and ``[residency]``: how many stay on
the GPU, what "not resident" means, and how switches are paced.

Each entry resolves to a whole single-model config (``engine_configs``): the shared
sections with the entry's keys over them. That config is what its engine serves, planned
and launched exactly as a one-model deployment is.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictInt, field_validator

from vllm_offload.config.sections import ModelSection, _Section

# The per-model tables an entry may carry (the rest is the box's: one server, one manager).
MODEL_TABLES = ("gpu", "kv_offload", "weights_offload")


class ModelEntry(ModelSection):
    gpu: dict[str, Any] = Field(
        default_factory=dict, description="[gpu] keys for this model alone (over [gpu])."
    )
    kv_offload: dict[str, Any] = Field(
        default_factory=dict,
        description="[kv_offload] keys for this model alone, e.g. its cpu_tier_gib.",
    )
    weights_offload: dict[str, Any] = Field(
        default_factory=dict, description="[weights_offload] keys for this model alone."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="vLLM arguments for this model's engine, after the file's extra_args.",
    )
    gpus: list[StrictInt] | Literal["auto"] = Field(
        "auto",
        description="The GPUs (NVML indexes, as nvidia-smi lists them) this model's engine "
        "runs on; several: split over them by tensor parallelism. 'auto': the planner "
        "places each model on a GPU of its own where it can, the largest first, splits one "
        "that no GPU holds alone, and says why in `plan` (chose: placement). One GPU: all "
        "models share it.",
    )

    @field_validator("gpus")
    @classmethod
    def _gpu_list(cls, gpus: list[int] | str) -> list[int] | str:
        if isinstance(gpus, list):
            if not gpus:
                raise ValueError("name at least one GPU, or 'auto'")
            if len(set(gpus)) != len(gpus) or any(not 0 <= g < 64 for g in gpus):
                raise ValueError("GPU indexes 0 to 63, each once (e.g. [0] or [0, 1])")
        return gpus

    @field_validator("gpu", "kv_offload", "weights_offload")
    @classmethod
    def _plain_table(cls, table: dict[str, Any]) -> dict[str, Any]:
        for key, value in table.items():
            if isinstance(value, dict):
                raise ValueError(f"{key}: a value, not a table")
        return table


class ResidencySection(_Section):
    default_model: str = Field(
        "",
        description="Served name of the model on the GPU at start (several models). Empty: "
        "the first [[models]] entry.",
    )
    max_resident: int | Literal["auto"] = Field(
        "auto",
        description="Models on the GPU at once. 'auto': as many as fit together with KV "
        "pools that hold their max_model_len (the planner decides, sets each model's "
        "gpu.memory_utilization to its share and says so in `plan`; 1 without an NVIDIA "
        "GPU). A number above 1: each model's gpu.memory_utilization is its share, and the "
        "shares of any max_resident of them must fit together.",
    )
    idle: Literal["auto", "sleep", "stop"] = Field(
        "auto",
        description="What a model that is not on the GPU is: 'sleep' (its engine keeps "
        "running, its weights wait in host RAM and come back in under a second: vLLM's "
        "sleep mode, NVIDIA GPUs), 'stop' (its engine exits; the next request for it "
        "starts it again, a minute or more), or 'auto' (sleep on an NVIDIA GPU, stop "
        "elsewhere).",
    )
    sleep_level: Literal[1, 2] = Field(
        1,
        description="vLLM's sleep level: 1 keeps the weights in host RAM (fast wake), 2 drops "
        "them and reads them again from disk at wake (less RAM, slower wake).",
    )
    host_copy: Literal["keep", "release"] = Field(
        "keep",
        description="The host copy of a model's weights that a level-1 sleep makes, while the "
        "model is on the GPU: 'keep' holds it (a put-away is then near free: 0.04 s for an "
        "8B model on an H200, nothing to copy); 'release' gives it back after each wake, so "
        "a serving engine holds that much less host RAM, and each put-away copies the "
        "weights out again (a switch 6.5-8.6 s instead of 0.5 for an 8B model on an H200; "
        "min_resident_s 'auto' gives turns then). It does not let more models fit: at a "
        "switch the model put away copies its weights out while the one coming in still "
        "holds its copy, and the planner counts that moment either way.",
    )
    deep_sleep: bool = Field(
        False,
        description="A model asleep gives back the GPU memory its engine still keeps (its "
        "CUDA context and graphs: 1.5-2.4 GiB for an 8B model): the NVIDIA driver's process "
        "checkpoint (driver 570 or newer) moves it to host RAM after the sleep, and back "
        "before the wake. The planner then leaves no GPU memory for models asleep (3 GiB "
        "each otherwise), so the model on the GPU gets that much more, and counts it in "
        "host RAM instead. Each switch takes longer by the checkpoint and the restore "
        "(three 8B models on an H100: 1.1-1.9 s and 1.2-1.6 s, first token after a switch "
        "3.5 s instead of 0.55), so min_resident_s 'auto' gives turns. Not for a model "
        "split over GPUs (tensor "
        "parallel): refused (docs/several-models.md).",
    )
    layered_wake: bool = Field(
        False,
        description="A model woken from a level-1 sleep that keeps its host copy starts its "
        "first step while its weights are still coming back, each layer waiting on the GPU "
        "for its own copies only (vllm_offload/vllm_ext/layered_wake.py): the request's way "
        "in and its forward hide behind the copy: an 8B model's first token after a switch "
        "0.48 s instead of 0.51 on an H200, answers bit-identical (one run; off until more "
        "fresh starts: docs/design/switch-below-the-copy.md). Ignored where models stop, "
        "sleep at level 2 or give their copy back (residency.host_copy = 'release').",
    )
    asleep_weights_on_gpu_gib: float = Field(
        0.0,
        ge=0,
        description="GiB of each model's weights that stay on the GPU while it sleeps at "
        "level 1 (the last allocations of its weight pool, whole, up to this: its last "
        "layers, and its head where the embedding is not it): a switch "
        "copies only the rest back (the copy is most of a switch: ~0.36 s for an 8B "
        "model's 15 GiB on an H200), the model on the GPU gets that much less of it for "
        "each model asleep beside it, and the host copy is that much smaller. For a GPU "
        "with room beside the model it serves (several models on an 80 GB card); not with "
        "deep_sleep or sleep_level 2 (refused). 0: all of them go (the default).",
    )
    min_resident_s: float | Literal["auto"] = Field(
        "auto",
        description="A model's turn on the GPU, in seconds: once used, it stays this long "
        "(between its users' requests too) before another model's waiting requests may take "
        "its place, and those then run together: at most one switch per turn. A model "
        "nothing was asked of since it came in goes at once. 0 to 3600, or 'auto': 0 where "
        "models sleep at level 1 keeping their host copy (a switch is the weights' copy, "
        "about 0.5 s; switching for each request served people best at every load "
        "measured), else 5 (a switch copies the weights out or reads them again, "
        "checkpoints and restores the engine in deep sleep, or restarts it); `plan` says "
        "which. Numbers: "
        "docs/several-models.md.",
    )
    keep_alive_s: float | Literal["forever"] = Field(
        "forever",
        description="Seconds an idle model stays on the GPU before it is put away even "
        "though no other model asks ('forever': until another model needs the GPU; a "
        "resident model costs nothing while idle, and putting it away costs its next "
        "request a wake).",
    )
    queue_limit: int = Field(
        64,
        ge=1,
        le=100_000,
        description="Requests that may wait for model switches at once; past it the front "
        "door answers 503 with Retry-After.",
    )
    drain_timeout_s: float = Field(
        300.0,
        ge=1.0,
        le=86400.0,
        description="Seconds a model being put away lets its requests in flight finish; "
        "those still running then are ended with an error.",
    )
    preload: bool = Field(
        True,
        description="At start-up, where not all models fit on the GPU at once, start each "
        "model that sleeps when away, the default included, and put it to sleep once (a "
        "first switch then costs what later ones do); then start the models that stay on "
        "the GPU beside the default (where all fit, none sleeps); false: each starts on its "
        "first request. A model that stops when away starts on its first request either way.",
    )
    runtime_dir: str = Field(
        "",
        description="Directory of the engines' sockets and the front door's control socket. "
        "Empty: $RUNTIME_DIRECTORY (the unit's /run/<unit>-offload), else "
        "$XDG_RUNTIME_DIR/vllm-offload, else ~/.cache/vllm-offload/run.",
    )

    @field_validator("max_resident")
    @classmethod
    def _resident_count(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 8:
            raise ValueError("must be 1 to 8, or 'auto'")
        return value

    @field_validator("min_resident_s")
    @classmethod
    def _turn_bounds(cls, value: float | str) -> float | str:
        if isinstance(value, float) and not 0 <= value <= 3600:
            raise ValueError("must be 0 to 3600 seconds, or 'auto'")
        return value

    @field_validator("keep_alive_s")
    @classmethod
    def _positive_keep_alive(cls, value: float | str) -> float | str:
        if isinstance(value, float) and not 0 < value <= 86400 * 365:
            raise ValueError("must be a number of seconds > 0, or 'forever'")
        return value

    @field_validator("runtime_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if path and not path.startswith("/"):
            raise ValueError("must be an absolute path (or '' for the default)")
        return path
