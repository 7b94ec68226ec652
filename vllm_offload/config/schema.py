"""The whole config: its sections, and reading one from plain data (as TOML gives it) with
the first bad key named."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError, field_validator

from vllm_offload.config.flags import refused_flag
from vllm_offload.config.sections import (
    GpuSection,
    KvOffloadSection,
    ManagerSection,
    ModelSection,
    ParallelSection,
    ServerSection,
    WeightsOffloadSection,
    _Section,
)
from vllm_offload.errors import FieldError


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

    @field_validator("extra_args")
    @classmethod
    def _no_launcher_flags(cls, extra_args: list[str]) -> list[str]:
        for token in extra_args:
            if (reason := refused_flag(token)) is not None:
                raise ValueError(reason)
        return extra_args


SECTIONS: dict[str, type[_Section]] = {
    name: info.annotation
    for name, info in DeploymentConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, _Section)
}


def _first_error(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("int", "float", "literal")))
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key; remove it (see `vllm-offload config show` for the valid keys)"
    return ConfigError(loc or "config", msg)


def parse(data: dict[str, Any]) -> DeploymentConfig:
    """Validate a plain dict (as read from TOML); raise ConfigError naming the first bad key."""
    try:
        return DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None


def with_overrides(config: DeploymentConfig, overrides: dict[str, Any]) -> DeploymentConfig:
    """A copy with ``{"section.key": value}`` applied, validated like the file itself."""
    data = config.model_dump()
    for dotted, value in overrides.items():
        section, _, key = dotted.rpartition(".")
        target = data[section] if section else data
        target[key] = value
    return parse(data)
