"""The server as a service: start, stop and restart it (a start that `serve` would refuse
is refused now, with its reason), empty its disk tier, and ask it one short question."""

from __future__ import annotations

from contextlib import suppress
from typing import Annotated, Any, Literal

import httpx
import psutil
from fastapi import APIRouter, Depends

from vllm_offload import disk_layout, launch
from vllm_offload.box.prepare import several
from vllm_offload.config.schema import model_name
from vllm_offload.errors import Refused, VllmOffloadError
from vllm_offload.manager import reach
from vllm_offload.manager.state import Manager, manager_of
from vllm_offload.systemd.control import ServiceError
from vllm_offload.upstream.client import VllmClient

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]
PROBE_TIMEOUT_S = 60


@router.post("/api/service/{action}")
def control(manager: Shared, action: Literal["start", "stop", "restart"]) -> dict[str, str]:
    if action != "stop":
        # Starting on a config that cannot be served only makes a crash loop: say why now.
        try:
            config = manager.load()
            manager.startable(config, config)
        except VllmOffloadError as exc:
            raise Refused(exc.field, f"{exc.message} (not {action}ing the server)") from None
        manager.sampler.follow(reach.server_url(config))
    try:
        getattr(manager.settings.systemd, action)(manager.settings.unit)
    finally:
        manager.monitor.changed()
    return {"status": f"{action} requested"}


@router.post("/api/cache/clear")
def cache_clear(manager: Shared) -> dict[str, Any]:
    """Empty the disk tier, as `vllm-offload cache clear` does: refused (409) while the
    server uses it."""
    files, removed = disk_layout.clear_tier(manager.load().kv_offload.disk_path)
    return {"files": files, "bytes": removed}


def served_by_the_unit(manager: Manager, address: str, port: int) -> None:
    """Refuse (409) unless every socket a connection to ``address``:``port`` could reach
    belongs to the unit's server: the probe sends the API key, and any local user can
    listen on a port the stopped server left free (one did, took the key and answered
    'healthy'), or on another address of the same name (``[::1]``)."""
    unit, _health = manager.monitor.current()
    owners = reach.listener_uids(address, port)
    with suppress(psutil.NoSuchProcess):
        if unit.main_pid is not None and owners == {psutil.Process(unit.main_pid).uids().real}:
            return
    raise Refused(
        "server.port",
        f"a process listening on {address} port {port} is not "
        f"{manager.settings.unit}.service's server (another user's, or the unit is "
        "not running); the API key is not sent",
    )


@router.post("/api/probe")
def probe(manager: Shared, model: str = "") -> dict[str, Any]:
    """Ask the running server one short chat question (confirms a switch worked); with
    several models, ``model`` names which (default: the default model)."""
    sampler = manager.sampler
    if not sampler.server_healthy and not sampler.probe_health():
        raise Refused(
            "server",
            "the server is not running or not healthy yet; start it "
            "(POST /api/service/start) and wait for health",
        )
    config = manager.load()
    address = reach.server_address(config)  # resolved once: checked, then connected to
    if config.server.api_key_file:
        served_by_the_unit(manager, address, config.server.port)
    if several(config):
        name = model or config.residency.default_model or model_name(config.models[0])
    else:
        name = model_name(config.model)
    body = {"model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}
    key = launch.read_api_key(config)
    try:
        with VllmClient(reach.url(address, config.server.port), key) as server:
            response = server.post("/v1/chat/completions", body, PROBE_TIMEOUT_S)
            response.raise_for_status()
            answer = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ServiceError(f"the server did not answer: {exc}") from None
    return {"model": answer.get("model"), "answer": answer["choices"][0]["message"]["content"]}
