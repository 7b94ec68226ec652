"""The deployment config: one typed model, read from and written to TOML.

This package knows the schema and nothing else. Every other part of vllm-offload
(planner, launcher, manager, unit files) reads a ``DeploymentConfig``; the field
descriptions feed ``--help`` and the docs. ``sections`` holds the keys, ``flags`` the vLLM
flags the launcher owns, ``schema`` the whole config, ``files`` its TOML file.
"""

from vllm_offload.config.cluster import ClusterBox, ClusterSection
from vllm_offload.config.files import (
    DEFAULT_CONFIG_PATH,
    default_path,
    file_tag,
    load,
    load_default,
    save,
    sweep_temp_files,
    to_toml,
    user_config_path,
)
from vllm_offload.config.flags import LAUNCHER_FLAGS, UNSUPPORTED_FLAGS, flag_name, refused_flag
from vllm_offload.config.schema import (
    SECTIONS,
    ConfigError,
    DeploymentConfig,
    parse,
    with_overrides,
)
from vllm_offload.config.sections import MAX_GIB, ManagerSection

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "LAUNCHER_FLAGS",
    "MAX_GIB",
    "SECTIONS",
    "UNSUPPORTED_FLAGS",
    "ClusterBox",
    "ClusterSection",
    "ConfigError",
    "DeploymentConfig",
    "ManagerSection",
    "default_path",
    "file_tag",
    "flag_name",
    "load",
    "load_default",
    "parse",
    "refused_flag",
    "save",
    "sweep_temp_files",
    "to_toml",
    "user_config_path",
    "with_overrides",
]
