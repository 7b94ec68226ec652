"""Find vLLM servers on this host, ours or not: listening processes whose command line
mentions vLLM, confirmed by their /v1/models."""

from __future__ import annotations

from typing import Any

import psutil

from vllm_offload.upstream.client import VllmClient

LOOKS_LIKE_VLLM = ("vllm", "vllm_offload")


def _models(port: int) -> list[str] | None:
    with VllmClient(f"http://127.0.0.1:{port}", timeout_s=1) as server:
        return server.models()


def find_vllm_servers() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    seen: set[int] = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.pid is None or not conn.laddr:
            continue
        port = conn.laddr.port
        if port in seen:
            continue
        try:
            cmdline = " ".join(psutil.Process(conn.pid).cmdline())
        except psutil.Error:
            continue
        if not any(word in cmdline for word in LOOKS_LIKE_VLLM):
            continue
        models = _models(port)
        if models is None:
            continue
        seen.add(port)
        found.append({"pid": conn.pid, "port": port, "models": models, "command": cmdline[:300]})
    return found
