"""The whole config: its sections, reading one from plain data (as TOML gives it) with the
first bad key named, and (several models) each model's own single-model config."""

from __future__ import annotations

import difflib
import json
import os
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from vllm_offload.config.cluster import ClusterSection
from vllm_offload.config.flags import flag_name, refused_flag
from vllm_offload.config.models import MODEL_TABLES, ModelEntry, ResidencySection
from vllm_offload.config.offload_sections import KvOffloadSection, WeightsOffloadSection
from vllm_offload.config.sections import (
    GpuSection,
    ManagerSection,
    ModelSection,
    ParallelSection,
    ServerSection,
    _Section,
)
from vllm_offload.errors import FieldError
from vllm_offload.model import real as real_model
from vllm_offload.model.hub import hub_ref


class ConfigError(FieldError):
    """A config value is wrong; ``field`` names it (``section.key``) and the text says the fix."""


class DeploymentConfig(_Section):
    model: ModelSection = Field(default_factory=ModelSection)
    gpu: GpuSection = Field(default_factory=GpuSection)
    kv_offload: KvOffloadSection = Field(default_factory=KvOffloadSection)
    weights_offload: WeightsOffloadSection = Field(default_factory=WeightsOffloadSection)
    parallel: ParallelSection = Field(default_factory=ParallelSection)
    server: ServerSection = Field(default_factory=ServerSection)
    manager: ManagerSection = Field(default_factory=ManagerSection)
    extra_args: list[str] = Field(
        default_factory=list,
        description="Arguments passed to vLLM's OpenAI server as they are, after the ones "
        "vllm-offload writes; flags it writes itself (--max-model-len, --port, ...) are "
        "refused: set their config keys instead.",
    )
    models: list[ModelEntry] = Field(
        default_factory=list,
        description="Several models on one box ([[models]] entries instead of [model]): one "
        "OpenAI port routes each request to its model, brought onto the GPU when asked for "
        "([residency]). Each entry has [model]'s keys and may have its own gpu, kv_offload "
        "and weights_offload tables and extra_args over the shared ones.",
    )
    residency: ResidencySection = Field(default_factory=ResidencySection)
    cluster: ClusterSection = Field(default_factory=ClusterSection)

    @field_validator("extra_args")
    @classmethod
    def _no_launcher_flags(cls, extra_args: list[str]) -> list[str]:
        for token in extra_args:
            if (reason := refused_flag(token)) is not None:
                raise ValueError(reason)
        return extra_args

    @model_validator(mode="after")
    def _compilation_config_in_fields(self) -> DeploymentConfig:
        """server.reproducible sets one field of vLLM's --compilation-config, dotted, and
        vLLM's parser then drops a whole one given as JSON (issue #54)."""
        whole = [t for t in self.extra_args if flag_name(t) in ("--compilation-config", "-cc")]
        whole = [t for t in whole if "." not in t.split("=", 1)[0]]
        if self.server.reproducible and whole:
            raise ValueError(
                f"extra_args: {whole[0][:60]}: with server.reproducible vllm-offload sets one "
                "field of --compilation-config, and vLLM would then drop a whole one; give "
                "each field dotted (--compilation-config.cudagraph_mode=PIECEWISE)"
            )
        return self


SECTIONS: dict[str, type[_Section]] = {
    name: info.annotation
    for name, info in DeploymentConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, _Section)
}


def _model_at(parts: list[str | int]) -> type[BaseModel] | None:
    """The config record holding the key at ``parts`` (its last part); None past a table
    that is not a record."""
    model: type[BaseModel] = DeploymentConfig
    for part in parts[:-1]:
        if isinstance(part, int):
            continue
        info = model.model_fields.get(part)
        annotation = info.annotation if info is not None else None
        if typing.get_origin(annotation) is list:
            annotation = typing.get_args(annotation)[0]
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        model = annotation
    return model


def _unknown_key_fix(parts: list[str | int]) -> str:
    """What an unknown key was likely meant to be: the same key in another section, the
    closest key of its own, or the list of them."""
    name, model = str(parts[-1]), _model_at(parts)
    if model is None:
        return "remove it (see `vllm-offload config show` for the valid keys)"
    if model is DeploymentConfig or len(parts) < 2:
        close = difflib.get_close_matches(name, list(SECTIONS), n=1, cutoff=0.6)
        return (
            f"did you mean [{close[0]}]?"
            if close
            else (f"the sections are {', '.join(f'[{s}]' for s in SECTIONS)}")
        )
    homes = [s for s, section in SECTIONS.items() if name in section.model_fields]
    if homes and parts[0] == "models" and homes[0] in MODEL_TABLES:
        return f"it belongs in the entry's [models.{homes[0]}] table"
    if homes:
        return f"it belongs in [{homes[0]}] ({homes[0]}.{name})"
    close = difflib.get_close_matches(name, list(model.model_fields), n=1, cutoff=0.6)
    if close:
        return f"did you mean {close[0]}?"
    return f"its keys are {', '.join(model.model_fields)}"


# pydantic's errors for a value that is no number at all (not one out of range).
NOT_A_NUMBER = (
    "int_parsing",
    "float_parsing",
    "int_type",
    "float_type",
    "int_from_float",
    "literal_error",
)


def _neither_auto_nor_number(errors: list[Any]) -> str | None:
    """``int | 'auto'`` (or float) given something else: pydantic reports each branch;
    say both in one sentence, with the unit the key's name carries."""
    if len(errors[0]["loc"]) < 2:
        return None
    same = [e for e in errors if e["loc"][:-1] == errors[0]["loc"][:-1]]
    tags = {str(e["loc"][-1]) for e in same}
    if "literal['auto']" not in tags or not tags & {"int", "float"}:
        return None
    if any(e["type"] not in NOT_A_NUMBER for e in same):  # a number out of range says so
        return None
    key = str(errors[0]["loc"][-2])
    number = "a whole number" if "int" in tags else "a number"
    unit = (
        " of tokens (e.g. 4096)"
        if key.endswith(("_len", "_tokens", "block_size"))
        else " of bytes"
        if key.endswith("_bytes")
        else " of GiB"
        if key.endswith("_gib")
        else " of seconds"
        if key.endswith("_s")
        else ""
    )
    return f'{json.dumps(errors[0]["input"], default=str)} is neither "auto" nor {number}{unit}'


def _first_error(exc: ValidationError) -> ConfigError:
    errors = exc.errors()
    err = errors[0]
    parts = [p for p in err["loc"] if not str(p).startswith(("int", "float", "literal"))]
    loc = ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in parts).replace(".[", "[")
    msg = _neither_auto_nor_number(list(errors)) or err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = f"unknown key; {_unknown_key_fix(parts)}"
    return ConfigError(loc or "config", msg)


def parse(data: dict[str, Any]) -> DeploymentConfig:
    """Validate a plain dict (as read from TOML); raise ConfigError naming the first bad key."""
    try:
        config = DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    if config.models:
        engine_configs(config)  # each model's whole config must be valid too
    return config


def model_name(entry: ModelSection) -> str:
    """The name a model answers to, the one rule for `serve`, the front door and the
    manager: its served_name, else its hub id (org/name, as `vllm serve org/name`
    answers), else its folder's name as configured (``~`` expanded, relative to the
    working directory: a link's own name, not its target's, so an HF snapshot does not
    answer to its hash), else the default model's."""
    if entry.served_name:
        return entry.served_name
    if (ref := hub_ref(entry.path)) is not None:
        return ref.repo_id
    if entry.path:
        return Path(os.path.abspath(os.path.expanduser(entry.path))).name
    return real_model.DEFAULT_NAME


def entry_field(index: int, field: str) -> str:
    """A key of one model's own config as its [[models]] entry names it: model.max_model_len
    -> models[1].max_model_len, kv_offload.cpu_tier_gib -> models[1].kv_offload.cpu_tier_gib."""
    return f"models[{index}].{field.removeprefix('model.')}"


def engine_configs(config: DeploymentConfig) -> dict[str, DeploymentConfig]:
    """Each [[models]] entry's own single-model config, by the name it answers to: the
    shared sections with the entry's tables over them, the file's extra_args then its own.
    Raises ConfigError naming the entry's key (models[1].kv_offload.cpu_tier_gib)."""
    if config.model != ModelSection():
        raise ConfigError(
            "model",
            "with [[models]] entries, give each model there; remove "
            "[model] (or keep [model] alone for one model)",
        )
    shared = config.model_dump(exclude={"models", "residency"})
    configs: dict[str, DeploymentConfig] = {}
    for i, entry in enumerate(config.models):
        name = model_name(entry)
        if name in configs:
            raise ConfigError(
                f"models[{i}].served_name",
                f"'{name}' names two models; give each its own served_name",
            )
        data = {**shared, "model": entry.model_dump(include=set(ModelSection.model_fields))}
        for table in MODEL_TABLES:
            data[table] = {**shared[table], **getattr(entry, table)}
        data["extra_args"] = [*config.extra_args, *entry.extra_args]
        try:
            configs[name] = DeploymentConfig.model_validate(data)
        except ValidationError as exc:
            error = _first_error(exc)
            raise ConfigError(entry_field(i, error.field), error.message) from None
    default = config.residency.default_model
    if default and default not in configs:
        raise ConfigError(
            "residency.default_model",
            f"'{default}' is none of the models' names ({', '.join(configs)})",
        )
    return configs


def with_overrides(config: DeploymentConfig, overrides: dict[str, Any]) -> DeploymentConfig:
    """A copy with ``{"section.key": value}`` applied, validated like the file itself."""
    data = config.model_dump()
    for dotted, value in overrides.items():
        section, _, key = dotted.rpartition(".")
        target = data[section] if section else data
        target[key] = value
    return parse(data)
