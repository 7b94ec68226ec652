"""One `vllm-offload serve` per arm, all started at once (arms side by side on one GPU),
each with its own compile cache, stopped together however the experiment ends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.model import split_line
from vllm_offload.bench.server_process import ServerProcess

# What vLLM logs of a start's phases (seconds).
START_PHASES = {
    "weights_s": r"Loading weights took ([\d.]+) seconds",
    "model_loading_s": r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "compile_s": r"init engine .* \(compilation: ([\d.]+) s",
    "graphs_s": r"Graph capturing finished in ([\d.]+) secs",
}


@dataclass(kw_only=True)
class Arm:
    """``serve_args``: `vllm-offload serve` flags, then "--" and vLLM's own; ``env``: more
    of the server's environment; ``cache``: its compile cache (vLLM's, Inductor's and
    Triton's), emptied first when ``cold``."""

    name: str
    serve_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cache: Path | None = None
    cold: bool = True


def cache_env(cache: Path) -> dict[str, str]:
    """Every compile cache of one server under ``cache``."""
    return {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that serves vllm_offload from ``tree`` (an earlier commit's copy),
    checked by importing it so: ``python -m`` puts its working directory (the head's
    tree, where the scripts run) before PYTHONPATH unless PYTHONSAFEPATH is set, and
    fair13's base arm ran the head's rules without it (its log's line numbers were the
    head's). Raises RuntimeError where the import still finds another tree."""
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
        "PYTHONSAFEPATH": "1",
    }
    run = subprocess.run(
        [sys.executable, "-c", "import vllm_offload; print(vllm_offload.__file__)"],
        env=dict(os.environ) | env,
        capture_output=True,
        text=True,
        check=False,
    )
    found = run.stdout.strip()  # the package itself, not any tree above the head's
    if (
        run.returncode
        or not found
        or Path(found).resolve().parent != (tree / "vllm_offload").resolve()
    ):
        raise RuntimeError(
            f"vllm_offload imports from {found or 'nowhere'}, not {tree}: {run.stderr[-300:]}"
        )
    return env


def start_phases(log: str) -> dict[str, float]:
    return {
        key: float(m.group(1))
        for key, pattern in START_PHASES.items()
        if (m := re.search(pattern, log))
    }


def kernel_choices(cache: Path) -> dict[str, Any]:
    """The kernel configs Inductor chose by timing (its ``*.best_config`` files, named by
    the kernel's source hash: the same kernel has the same name in every cache)."""
    chosen = {}
    for path in sorted(cache.rglob("*.best_config")):
        try:
            chosen[path.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            chosen[path.name] = None
    return chosen


@contextmanager
def serving(arms: list[Arm], out: Path, timeout_s: float = 1200) -> Iterator[dict[str, Any]]:
    """Start every arm (its log: ``out``/NAME.log), wait for each; yields {"servers":
    {name: ServerProcess} of those that came up, "starts": {name: its healthy_s and
    start_phases, or its error}}. Stops them all on the way out."""
    import shutil

    servers: dict[str, ServerProcess] = {}
    starts: dict[str, Any] = {}
    out.mkdir(parents=True, exist_ok=True)
    try:
        for arm in arms:
            env = dict(os.environ) | arm.env
            if arm.cache is not None:
                if arm.cold:
                    shutil.rmtree(arm.cache, ignore_errors=True)
                env |= cache_env(arm.cache)
            server = ServerProcess(
                serve_args=arm.serve_args, log_path=out / f"{arm.name}.log", env=env
            )
            server.start()
            servers[arm.name] = server
        up: dict[str, ServerProcess] = {}
        for name, server in servers.items():
            try:
                starts[name] = {"healthy_s": round(server.wait_healthy(timeout_s), 1)}
                up[name] = server
            except (RuntimeError, TimeoutError) as exc:
                starts[name] = {"error": str(exc)}
            starts[name] |= start_phases(server.log_path.read_text(errors="replace"))
        yield {"servers": up, "starts": starts}
    finally:
        for server in servers.values():
            server.stop()


def start_arms(
    servers: dict[str, ServerProcess], flags: dict[str, list[str]], arms: dict[str, Any]
) -> list[str]:
    """Start every server at once, wait for each, note its flags, start time and pool
    split in ``arms``; the names of those that came up."""
    for server in servers.values():
        server.start()
    for name, server in servers.items():
        arm: dict[str, Any] = {"flags": flags[name]}
        arms[name] = arm
        try:
            arm["healthy_s"] = server.wait_healthy()
            arm["split"] = split_line(server.log_path.read_text(errors="replace"))
        except Exception as exc:
            arm["error"] = repr(exc)
    return [name for name in servers if "error" not in arms[name]]
