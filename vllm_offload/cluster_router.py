"""The router in front of several boxes (``[cluster]``): SGLang's ``smg`` (docs/several-boxes.md
says why this one), configured from ours. ``manifest`` is smg's file-discovery manifest (one
worker per box and model: smg routes a request only to the workers of its ``model``);
``command`` is the router's command line: ``main`` here writes the manifest from the config
and runs smg in its process, the API key read from its file so that it never appears in
argv (smg takes it only as ``--api-key``).

smg rereads the manifest when it changes, so adding a box is a config edit and a rewrite.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from vllm_offload import config as config_mod
from vllm_offload.config import ClusterSection
from vllm_offload.safe_files import read_secret

MANIFEST_VERSION = 1
# The manifest is reread on change and at least this often (seconds).
MANIFEST_REREAD_S = 10
# A failed /health probe takes a box out at once, one good probe brings it back; with
# removal off, a box that was down stays registered and comes back by itself (smg's
# default under discovery removes it, and the file provider does not add it again).
HEALTH_FLAGS = (
    "--health-failure-threshold=1",
    "--health-success-threshold=1",
    "--no-remove-unhealthy-workers",
)


def manifest(cluster: ClusterSection) -> dict[str, Any]:
    workers = [
        {"id": f"{box.name}/{model}", "url": url, "model_id": model}
        for box in cluster.boxes
        for model, url in box.addresses().items()
    ]
    return {"version": MANIFEST_VERSION, "workers": workers}


def routes(cluster: ClusterSection) -> dict[str, list[str]]:
    """Which boxes serve each model: model -> ["box (address)", ...]."""
    found: dict[str, list[str]] = {}
    for box in cluster.boxes:
        for model, url in box.addresses().items():
            found.setdefault(model, []).append(f"{box.name} ({url})")
    return found


def render_routes(cluster: ClusterSection) -> str:
    """`plan`'s lines for [cluster]: the router and which boxes serve each model."""
    lines = [
        f"cluster: smg on {cluster.router_host}:{cluster.router_port}, policy "
        f"{cluster.policy}; each box plans its own models (run `plan` there)"
    ]
    lines += [f"  {model}: {', '.join(boxes)}" for model, boxes in routes(cluster).items()]
    return "\n".join(lines)


def write_manifest(cluster: ClusterSection, path: Path) -> None:
    """Atomically (smg watches the file and must never read half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as out:
        json.dump(manifest(cluster), out, indent=1)
        out.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def smg_args(cluster: ClusterSection, manifest_path: Path) -> list[str]:
    """smg's own flags, each as one ``--flag=value`` token."""
    return [
        f"--host={cluster.router_host}",
        f"--port={cluster.router_port}",
        f"--policy={cluster.policy}",
        "--discovery-provider=file",
        f"--discovery-file={manifest_path}",
        f"--discovery-check-interval-secs={MANIFEST_REREAD_S}",
        f"--health-check-interval-secs={cluster.health_check_interval_s}",
        *HEALTH_FLAGS,
        f"--prometheus-host={cluster.metrics_host}",
        f"--prometheus-port={cluster.metrics_port}",
        "--log-level=warn",
    ]


def command(python: str, config_path: Path, manifest_path: Path) -> list[str]:
    """The router's command line (its unit's ExecStart): ``main`` below."""
    return [python, "-m", __name__, f"--config={config_path}", f"--manifest={manifest_path}"]


def main(argv: list[str] | None = None) -> None:
    """Write the manifest from the config's ``[cluster]``, then run smg in this process
    with the key read from ``cluster.api_key_file``."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="the config with [cluster]")
    parser.add_argument("--manifest", type=Path, required=True, help="smg's manifest, written")
    args = parser.parse_args(argv)
    try:
        cluster = config_mod.load(args.config).cluster
        key = read_secret(cluster.api_key_file) if cluster.api_key_file else None
    except config_mod.ConfigError as exc:
        parser.exit(2, f"{exc}\n")
    except (OSError, ValueError) as exc:
        parser.exit(2, f"cluster.api_key_file: {exc}\n")
    if not cluster.boxes:
        parser.exit(2, "cluster.boxes: no boxes to route to; list them as [[cluster.boxes]]\n")
    write_manifest(cluster, args.manifest)
    from smg.launch_router import launch_router, parse_router_args  # the router's package

    router_args = parse_router_args(smg_args(cluster, args.manifest))
    router_args.api_key = key
    launch_router(router_args)


if __name__ == "__main__":
    main()
