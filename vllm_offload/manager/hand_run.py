"""A server the manager did not start: its unit is down and something answers /health on
the configured port (`make serve`, a `vllm-offload serve` in a terminal). The page shows
that server's own account (its process, the models it answers to) instead of the unit's,
and says plainly what the manager cannot do for it: its buttons act on the unit, and its
log is on the terminal that started it, not in the journal."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import psutil

from vllm_offload.config import DeploymentConfig
from vllm_offload.manager.reach import server_url
from vllm_offload.upstream.client import VllmClient

MODELS_TIMEOUT_S = 1.0


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` (None where this user may not see it)."""
    with suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                return conn.pid
    return None


def server(config: DeploymentConfig) -> dict[str, Any]:
    """The hand-run server on the configured port: its pid and the models it answers to,
    read from the server itself (without the API key: the manager sends that only to its
    unit's process)."""
    with VllmClient(server_url(config), timeout_s=MODELS_TIMEOUT_S) as client:
        models = client.models()
    return {"pid": listener_pid(config.server.port), "port": config.server.port, "models": models}


def reason(found: dict[str, Any], unit: str, key_file: str) -> str:
    """What the page says of a hand-run server: what it is, and what the manager needs."""
    who = f"pid {found['pid']}" if found["pid"] else "another user's process"
    if found["models"] is not None:
        answers = f"answers to {', '.join(found['models'])}"
    else:
        answers = "its models are not listed" + (" (it wants the API key)" if key_file else "")
    return (
        f"a server started by hand ({who}) answers on port {found['port']} and {answers}; "
        f"this page shows it, but Start, Stop and Restart act on {unit}.service (Start "
        "would find the port taken) and its log is on the terminal that started it. To "
        f"manage it here, stop it and press Start (or `systemctl start {unit}`)"
    )
