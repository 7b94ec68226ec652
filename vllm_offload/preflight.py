"""What of this machine forbids a start, checked before one (for `serve`, `plan` and the
manager alike, one model or several): the API key's file, a listener beyond this machine
with no key, a link planted where the disk tier writes, LMCache where a model uses it, and
vLLM's patch state."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Mapping

from vllm_offload import disk_layout, launch
from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import VllmOffloadError
from vllm_offload.launch_spec import PreflightError
from vllm_offload.upstream import patching
from vllm_offload.upstream.patch_journal import PatchError
from vllm_offload.upstream.version import API_KEY_ENV, InstalledVllm


def machine_checks(
    config: DeploymentConfig,
    lmcache: bool,
    environ: Mapping[str, str],
    vllm: InstalledVllm | None,
    allow_unpatched: bool,
) -> tuple[str | None, list[VllmOffloadError], list[str]]:
    """The API key, and what of this machine forbids a start (the key's file, LMCache where
    a model uses it, vLLM's patch state), and the notes they leave."""
    problems: list[VllmOffloadError] = []
    notes: list[str] = []
    try:
        api_key = launch.read_api_key(config)
    except PreflightError as exc:
        problems.append(exc)
        api_key = None
    if api_key is None and not environ.get(API_KEY_ENV) and not is_loopback(config.server.host):
        notes.append(
            f"warning: server.host {config.server.host} listens beyond this machine and no "
            "API key is set: anyone who reaches the port can use the models; write one to "
            "a file and set server.api_key_file (or server.host = '127.0.0.1')"
        )
    if config.kv_offload.disk_path and (tier := tier_link(config.kv_offload.disk_path)):
        problems.append(PreflightError("kv_offload.disk_path", tier))
    if vllm is not None and lmcache and (missing := lmcache_problem(environ)) is not None:
        problems.append(PreflightError("kv_offload.backend", missing))
    if vllm is not None and (unpatched := patch_problem(vllm)) is not None:
        if allow_unpatched:
            notes.append(f"warning: {unpatched}; starting anyway (--allow-unpatched)")
        else:
            problems.append(
                PreflightError(
                    "vllm",
                    f"{unpatched}; run `vllm-offload patch apply` (make install does), or pass "
                    "--allow-unpatched",
                )
            )
    return api_key, problems, notes


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine reaches."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tier_link(disk_path: str) -> str | None:
    """Why the disk tier's folder cannot be used as it is (a link, which the tier never
    makes: planted by the server's user, or code it ran), or None."""
    root = disk_layout.tier_root(disk_path)
    if not root.is_symlink():
        return None
    return (
        f"{root} is a symbolic link, which the disk tier never makes and will not "
        "follow; remove it (the server's user, or code it ran, planted it)"
    )


def patch_problem(vllm: InstalledVllm) -> str | None:
    """Why the installed vLLM is not as vllm-offload's patches leave it, or None."""
    site = vllm.package_dir.parent
    try:
        state = patching.status(site)
    except PatchError as exc:
        return str(exc)
    if state is not patching.State.APPLIED:
        return f"vLLM {vllm.version} at {site} is not patched by vllm-offload"
    return None


# The LMCache release measured with vLLM 0.32.0 (`make install LMCACHE=1` installs it).
LMCACHE_VERSION = "0.5.6"
# Imports LMCache's compiled ops as its connector does; prints LMCache's version.
_LMCACHE_PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "if u.find_spec('lmcache') is None: sys.exit(3)\n"
    "print(m.version('lmcache'))\n"
    "import lmcache.cuda_ops\n"
)
# (python, PYTHONPATH) -> (when, problem): the manager prepares on every status poll
_lmcache_checked: dict[tuple[str, str], tuple[float, str | None]] = {}
LMCACHE_RECHECK_S = 60.0  # how long a problem stands before it is checked again


def lmcache_problem(environ: Mapping[str, str], python: str = sys.executable) -> str | None:
    """Why LMCache cannot serve with this Python, or None. Its compiled ops are built for
    one torch (LMCache 0.5.6: torch 2.13's C++ ABI); where they do not load, LMCache only
    logs it and copies with slow torch code, so that is refused too. Runs in a child
    process (it imports torch: seconds); a pass is kept, a problem for LMCACHE_RECHECK_S
    (the fix may be installed meanwhile)."""
    key = (python, environ.get("PYTHONPATH", ""))
    cached = _lmcache_checked.get(key)
    if cached is not None and (
        cached[1] is None or time.monotonic() - cached[0] < LMCACHE_RECHECK_S
    ):
        return cached[1]
    answer = _probe_lmcache(environ, python)
    _lmcache_checked[key] = (time.monotonic(), answer)
    return answer


def _probe_lmcache(environ: Mapping[str, str], python: str) -> str | None:
    fix = (
        f"`make install LMCACHE=1` (pip install 'vllm-offload[lmcache]': LMCache "
        f"{LMCACHE_VERSION}), or set kv_offload.backend = native"
    )
    try:
        probe = subprocess.run(
            [python, "-c", _LMCACHE_PROBE],
            env=dict(environ),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        return f"importing LMCache took over 300 s with {python}; {fix}"
    if probe.returncode == 3:
        return f"LMCache is not installed for {python}: {fix}"
    if probe.returncode != 0:
        version = probe.stdout.strip() or "?"
        error = (probe.stderr.strip().splitlines() or ["no error text"])[-1]
        return (
            f"LMCache {version}'s compiled ops do not load with this torch ({error}); "
            f"they are built for one torch release: {fix}"
        )
    return None
