"""What vLLM loads from vllm-offload through its own extension points (a general plugin,
the disk tier and the CPU tier's connector by module path, a sleep-mode backend), and the
logic the patch series calls from vLLM's files (kv_capacity, host_pinning,
kv_host_extension, kv_host_mapping): code that runs inside vLLM's processes, linted,
typed and tested here instead of living in the diffs. knobs.py names every setting they
read; it alone imports no vLLM, so the launcher can."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping

# What each vLLM process of an engine prints (stderr, whatever the log level) once the plugin
# made the arena its sleep backend: the front door sleeps an engine only after seeing it.
SLEEP_BACKEND_LINE = "vllm-offload: sleep backend: vllm_offload.vllm_ext.sleep's arena"
# vLLM loads general plugins from this entry-point group (vllm.plugins), as pyproject.toml
# registers ours; VLLM_PLUGINS, when set, is the comma-separated list of names it loads.
PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "vllm_offload"
PLUGIN_TARGET = "vllm_offload.vllm_ext.plugin:register"
EntryPoints = Iterable[importlib.metadata.EntryPoint]


def plugin_missing(
    environ: Mapping[str, str], entry_points: EntryPoints | None = None
) -> str | None:
    """Why vLLM would not load our plugin in a process with ``environ`` (None: it will).
    Without it vLLM only warns about our environment variables: an engine that sleeps
    would run vLLM's own sleep backend, not vllm_ext.sleep's arena, and hold more host RAM
    than planned (issue #43: 25.15 GiB where 24.45 were planned)."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=PLUGIN_GROUP)
    if not any(e.name == PLUGIN_NAME and e.value == PLUGIN_TARGET for e in entry_points):
        return (
            f"vLLM would not load vllm-offload's plugin: no '{PLUGIN_NAME} = "
            f"{PLUGIN_TARGET}' among the '{PLUGIN_GROUP}' entry points this Python "
            "sees (a source tree on PYTHONPATH has none): install the package"
        )
    allowed = environ.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        return (
            f"vLLM would not load vllm-offload's plugin: VLLM_PLUGINS={allowed!r} leaves "
            f"out '{PLUGIN_NAME}': add it, or unset VLLM_PLUGINS"
        )
    return None
