"""What the page polls: the server's state and plan (with several models, a card each),
the charts' samples, the log, other vLLM servers here; and the manager's /metrics."""

from __future__ import annotations

import grp
import os
import time
from contextlib import suppress
from typing import Annotated, Any

import psutil
from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse

from vllm_offload import disk_layout
from vllm_offload.box.control import read_models
from vllm_offload.box.prepare import PreparedBox
from vllm_offload.config import DeploymentConfig, ManagerSection
from vllm_offload.config.schema import model_name
from vllm_offload.deployment import Prepared
from vllm_offload.errors import Refused, VllmOffloadError
from vllm_offload.manager import bounded, detect, hand_run, wedge
from vllm_offload.manager.state import Manager, manager_of
from vllm_offload.manager.switches import ended, progress, switches
from vllm_offload.manager.unit_monitor import UnitMonitor, last_error
from vllm_offload.plan.box_render import box_json

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]
# The card reads vLLM's own KV-offload counters, which LMCache's connector does not feed.
LMCACHE_CARD = "LMCache exports none of vLLM's KV-offload counters; see its own log"
JOURNAL_HINT = (
    "(nothing to show: the manager's user may not read the journal. Add it to the "
    "systemd-journal group to see the server's log here and the reason it stopped; "
    "systemd has no per-unit permission, so it then reads every unit's log.)"
)

HAND_RUN_LOG = (
    "(the server answering now was started by hand, not by {unit}.service: its log is on "
    "the terminal that started it; below, the unit's journal)"
)


@router.get("/api/status")
def status(manager: Shared) -> dict[str, Any]:
    config = manager.load()
    settings = manager.settings
    unit, health = manager.monitor.current()
    uptime = process_age(unit.main_pid)
    reason = None
    if health in ("failed", "stopped", "crash-loop", "start-limit"):
        reason = last_error(settings.systemd.logs(settings.unit, 300))
        if health == "start-limit":
            reason = (
                "the service manager stopped restarting it (the unit's start limit): fix "
                f"the cause, then press Start. Last error: {reason or 'none logged'}"
            )
    found = hand_run.server(config) if health == "by-hand" else None
    if found is not None:
        reason = hand_run.reason(found, settings.unit, config.server.api_key_file)
        uptime = process_age(found["pid"])
    prepared = manager.prepared_saved(config)
    body: dict[str, Any] = {
        "unit": f"{settings.unit}.service",
        "active_state": unit.active_state,
        "sub_state": unit.sub_state,
        "pid": unit.main_pid,
        "uptime_s": uptime,
        "health": health,
        "reason": reason,
        "events": list(manager.monitor.watch.events),
        "wedge": wedge_status(manager.monitor, config.manager),
        **plan_cards(manager, config, prepared),
    }
    if found is not None:  # what the server itself says, not the unit
        served = ", ".join(found["models"] or []) or body["served_name"]
        body.update(pid=found["pid"], hand_run=found, served_name=served)
    if isinstance(prepared, PreparedBox):
        body.update(models_cards(manager, config, prepared, unit.running or found is not None))
        body["events"] = sorted(body["events"] + body.pop("switches"), key=lambda e: e["t"])
    return body


def process_age(pid: int | None) -> float | None:
    if pid is None:
        return None
    with suppress(psutil.Error):
        return round(time.time() - psutil.Process(pid).create_time(), 1)
    return None


def plan_cards(
    manager: Manager,
    config: DeploymentConfig,
    prepared: Prepared | PreparedBox | VllmOffloadError,
) -> dict[str, Any]:
    """The plan, what forbids a start, the CPU and disk tier cards."""
    if isinstance(prepared, VllmOffloadError):
        return {
            "plan": str(prepared),
            "problems": [],
            "model": config.model.path or "(demo model)",
            "served_name": "",
            "tier": manager.sampler.tier_card(0),
            "disk": manager.sampler.disk_card(0, None),
        }
    problems = [p.detail() for p in prepared.problems]
    if isinstance(prepared, PreparedBox):
        box_plan = prepared.plan
        tiers = sum(m.plan.cpu_tier.bytes for m in box_plan.models.values())
        return {
            "plan": box_json(box_plan),
            "problems": problems,
            "model": "several models",
            "served_name": ", ".join(box_plan.models),
            "tier": manager.sampler.tier_card(tiers),
            "disk": manager.sampler.disk_card(0, None),
        }
    plan = prepared.plan
    tier = (
        {"available": False, "why": LMCACHE_CARD}
        if plan.kv.backend == "lmcache"
        else manager.sampler.tier_card(plan.cpu_tier.bytes)
    )
    return {
        "plan": plan.to_json(),
        "problems": problems,
        "model": config.model.path or "(demo model)",
        "served_name": model_name(config.model),
        "tier": tier,
        "disk": manager.sampler.disk_card(plan.disk.bytes, tier_status(plan.disk.path)),
    }


def models_cards(
    manager: Manager, config: DeploymentConfig, prepared: PreparedBox, running: bool
) -> dict[str, Any]:
    """Several models: a card each (where its weights and KV go, its state now, its last
    switch), and the front door's switches for the events card (``running``: a front door
    is up, the unit's or one started by hand)."""
    live = read_models(manager.control_socket(config)) if running else {}
    # The server's user answers there: a reply that is not the front door's is said, not used.
    unreachable = live if isinstance(live, str) else None
    states = live.get("models", {}) if isinstance(live, dict) else {}
    events = switches(live.get("events") if isinstance(live, dict) else None)
    cards = []
    for name, model in prepared.plan.models.items():
        plan = model.plan
        last = next((e for e in reversed(events) if e["model"] == name), None)
        cards.append(
            {
                "name": name,
                "path": str(prepared.model_dirs[name]),
                "default": name == prepared.plan.default,
                "idle": model.idle,
                "state": "unknown" if unreachable else live_state(states.get(name)),
                "progress": progress(states.get(name)),
                "weights_bytes": plan.weights.bytes,
                "weights_gpu_bytes": plan.weights.gpu_bytes,
                "weights_offloaded_bytes": plan.weights.offloaded_bytes,
                "gpu_kv_pool_bytes": plan.gpu.kv_pool_bytes,
                "cpu_tier_bytes": plan.cpu_tier.bytes,
                "longest_request_tokens": plan.length.longest_request_tokens,
                "host_extension_bytes": plan.extension.bytes,
                "max_model_len": plan.length.max_model_len,
                "away_ram_bytes": model.away_ram_bytes,
                "gpus": list(model.gpus),  # plan.placement: its GPUs' NVML indexes
                "last_switch": last,
            }
        )
    texts = [{"t": e["t"], "text": e["text"] + took(e["seconds"])} for e in events]
    return {
        "models": cards,
        "switches": texts,
        "switch_steps": ended(events, prepared.plan.models),
        "control_error": unreachable,
    }


def live_state(row: object) -> str:
    state = row.get("state") if isinstance(row, dict) else None
    return state if isinstance(state, str) else "stopped"


def took(seconds: float | None) -> str:
    return f" ({seconds:.2f} s)" if seconds is not None else ""


def tier_status(disk_path: str) -> dict[str, float] | None:
    """The disk tier's own account; None where there is none or its filesystem hangs."""
    if not disk_path:
        return None
    with suppress(Refused):
        return bounded.call(
            lambda: disk_layout.read_status(disk_path),
            "kv_offload.disk_path",
            "reading the disk tier's status",
        )
    return None


def wedge_status(monitor: UnitMonitor, limits: ManagerSection) -> dict[str, Any]:
    watch = monitor.wedge
    return {
        "wedged": watch.wedged,
        "loads_stalled": watch.loads_stalled,
        "stalled_s": round(watch.stalled_s, 1),
        "reason": watch.reason,
        "wedge_after_s": limits.wedge_after_s,
        "restart_wedged": limits.restart_wedged,
        "restarts_last_hour": watch.restarts_within(time.time()),
    }


@router.get("/metrics", response_class=PlainTextResponse)
def prometheus(manager: Shared) -> str:
    """The manager's own view for Prometheus (Authorization: Bearer <token>)."""
    return wedge.prometheus_text(manager.monitor.wedge, healthy=manager.sampler.server_healthy)


@router.get("/api/metrics")
def metrics(manager: Shared, since: Annotated[float, Query(ge=0.0)] = 0.0) -> dict[str, Any]:
    return {"samples": manager.sampler.since(since)}


@router.get("/api/logs")
def logs(manager: Shared, lines: Annotated[int, Query(ge=1, le=5000)] = 200) -> dict[str, Any]:
    found = manager.settings.systemd.logs(manager.settings.unit, lines)
    if not found and not journal_readable():
        found = [JOURNAL_HINT]
    if manager.monitor.current()[1] == "by-hand":
        found = [HAND_RUN_LOG.format(unit=manager.settings.unit), *found]
    return {"lines": found}


@router.get("/api/detect")
def detect_servers(manager: Shared) -> dict[str, Any]:
    """vLLM servers here other than the one this page shows (the configured port's)."""
    port = manager.load().server.port
    return {"servers": [s for s in detect.find_vllm_servers() if s["port"] != port]}


def journal_readable() -> bool:
    """Whether this process may read other units' journal entries."""
    try:
        group = grp.getgrnam("systemd-journal").gr_gid
    except KeyError:
        group = None
    return os.geteuid() == 0 or (group is not None and group in os.getgroups())
