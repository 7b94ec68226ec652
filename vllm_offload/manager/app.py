"""The manager: a thin FastAPI shell over the config, deployment.prepare, the systemd unit
and the metrics sampler; every API body is untrusted input (see fence.py)."""

from __future__ import annotations

import grp
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import psutil
from fastapi import FastAPI, Form, Header, HTTPException, Query, Request, Response
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
)
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_offload import config as config_mod
from vllm_offload import deployment, disk_layout, hardware, launch, vllm_version
from vllm_offload.deployment import Prepared, model_dir, model_roots
from vllm_offload.errors import Refused, VllmOffloadError
from vllm_offload.manager import bounded, detect, fence, page, reach, wedge
from vllm_offload.manager.auth import SESSION_COOKIE, Sessions, authenticate, origin_matches
from vllm_offload.manager.metrics import Sampler
from vllm_offload.manager.reach import server_url
from vllm_offload.manager.unit_monitor import UnitMonitor, last_error
from vllm_offload.systemd.control import ServiceError, Systemd
from vllm_offload.vllm_client import VllmClient

MAX_BODY_BYTES = 64 * 1024
PROBE_TIMEOUT_S = 60


@dataclass
class ManagerSettings:
    config_path: Path
    token: str
    unit: str = "vllm"
    systemd: Systemd = field(default_factory=Systemd)
    sample_interval_s: float = 1.0


class BodyLimit:
    """413 for a body over ``max_bytes``: at once from its Content-Length, and while it
    arrives when it has none (chunked), before any handler has acted on it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = HTTPException(413, f"request body larger than {self.max_bytes} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            response = JSONResponse({"detail": too_large.detail}, status_code=413)
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise too_large  # FastAPI answers it while reading the body
            return message

        await self.app(scope, counted, send)


# The card reads vLLM's own KV-offload counters, which LMCache's connector does not feed.
LMCACHE_CARD = "LMCache exports none of vLLM's KV-offload counters; see its own log"


def _load(settings: ManagerSettings) -> config_mod.DeploymentConfig:
    """The saved config; a file that cannot be used refuses whatever needs it (409)."""
    try:
        return config_mod.load(settings.config_path)
    except config_mod.ConfigError as exc:
        raise Refused(exc.field, exc.message) from None


def prepare(config: config_mod.DeploymentConfig, saved: config_mod.DeploymentConfig) -> Prepared:
    """What `vllm-offload serve` would do with ``config`` on this host (the same checks
    and words), its model confined to the roots the ``saved`` file sets; within a time
    bound (it reads the model folder and the disk tier's)."""
    return bounded.call(
        lambda: deployment.prepare(config, hardware.probe(), os.environ, vllm_version.find(),
                                   roots=model_roots(saved)),
        "model.path", "reading the model folder",
    )  # fmt: skip


def startable(config: config_mod.DeploymentConfig, saved: config_mod.DeploymentConfig) -> Prepared:
    """``prepare``, refusing (409, the first reason) what `serve` would refuse."""
    prepared = prepare(config, saved)
    if prepared.problems:
        first = prepared.problems[0]
        raise Refused(first.field, first.message)
    return prepared


def tier_status(disk_path: str) -> dict[str, float] | None:
    """The disk tier's own account; None where there is none or its filesystem hangs."""
    if not disk_path:
        return None
    with suppress(Refused):
        return bounded.call(lambda: disk_layout.read_status(disk_path),
                            "kv_offload.disk_path", "reading the disk tier's status")  # fmt: skip
    return None


def list_models(config: config_mod.DeploymentConfig) -> list[dict[str, str]]:
    found = []
    for root in model_roots(config):
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if (child / "config.json").is_file():
                found.append({"name": child.name, "path": str(child)})
    return found


class ConfigBody(BaseModel):
    config: dict[str, Any]


def create_app(settings: ManagerSettings) -> FastAPI:
    config_mod.sweep_temp_files(settings.config_path)  # left by a save that was killed
    sessions = Sessions(settings.token)
    saving = threading.Lock()  # one save at a time: the If-Match check and the write
    sampler = Sampler(server_url(config_mod.load(settings.config_path)),
                      settings.sample_interval_s)  # fmt: skip

    def manager_section() -> config_mod.ManagerSection:
        """[manager] as the file says now; its defaults (no automatic restart) while the
        file cannot be read."""
        try:
            return config_mod.load(settings.config_path).manager
        except config_mod.ConfigError:
            return config_mod.ManagerSection()

    monitor = UnitMonitor(settings.systemd, settings.unit, sampler, limits=manager_section)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sampler.start()
        monitor.start()
        yield
        monitor.stop()
        sampler.stop()

    # No /docs or /redoc: they load Swagger UI from a CDN. The schema is /openapi.json.
    app = FastAPI(title="vllm-offload manager", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.sampler = sampler

    @app.exception_handler(VllmOffloadError)
    async def refused(_request: Request, exc: VllmOffloadError) -> JSONResponse:
        # One table (errors.OUTCOMES) decides the status: 422 bad input, 409 refused here,
        # 403 not the API's to change, 502 the service manager failed, 500 the machine is
        # not as it must be.
        return JSONResponse({"detail": exc.detail()}, status_code=exc.http_status)

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.middleware("http")
    async def require_token(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # Before anything reads the body: an anonymous caller learns nothing, not even a 422.
        if request.url.path.startswith("/api/") or request.url.path in ("/logout", "/metrics"):
            try:
                authenticate(request, sessions)
            except HTTPException as exc:
                return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        return await call_next(request)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers["Content-Security-Policy"] = page.CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "same-origin"  # no-referrer makes Origin: null
        if not request.url.path.startswith("/static/"):  # the page carries the CSRF token
            response.headers["Cache-Control"] = "no-store"
        return response

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        if monitor.stopped:
            return JSONResponse({"status": "the unit monitor stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/static/{name}")
    def static(name: Literal["dashboard.js", "style.css"]) -> FileResponse:
        media = "text/javascript" if name.endswith(".js") else "text/css"
        return FileResponse(page.STATIC / name, media_type=media)

    @app.get("/login", response_class=HTMLResponse)
    def login_page() -> str:
        return page.LOGIN

    @app.post("/login")
    def login(request: Request, token: str = Form(..., max_length=512)) -> Response:
        if not origin_matches(request):
            raise HTTPException(403, "the Origin header is missing or names another site")
        if not sessions.check_guess(request, "form", token.strip()):
            return HTMLResponse(page.LOGIN_FAILED, status_code=401)
        session_id, _csrf = sessions.create()
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")  # fmt: skip
        return response

    @app.post("/logout")
    def logout(request: Request) -> Response:
        sessions.drop(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    @app.get("/", response_class=HTMLResponse)
    def dashboard(request: Request) -> Response:
        csrf = sessions.csrf_for(request.cookies.get(SESSION_COOKIE))
        if csrf is None:
            return RedirectResponse("/login", status_code=303)
        return HTMLResponse(page.dashboard(csrf, settings.unit))

    @app.get("/api/status")
    def status() -> dict[str, Any]:
        config = _load(settings)
        try:
            unit, health = monitor.current()
        except ServiceError as exc:
            raise HTTPException(502, str(exc)) from None
        uptime = None
        if unit.main_pid is not None:
            with suppress(psutil.NoSuchProcess):
                uptime = round(time.time() - psutil.Process(unit.main_pid).create_time(), 1)
        reason = None
        if health in ("failed", "stopped", "crash-loop", "start-limit"):
            reason = last_error(settings.systemd.logs(settings.unit, 300))
            if health == "start-limit":
                reason = (
                    "the service manager stopped restarting it (the unit's start limit): fix "
                    f"the cause, then press Start. Last error: {reason or 'none logged'}"
                )
        problems: list[dict[str, str]] = []
        tier_bytes = disk_bytes = 0
        disk_path = backend = ""
        try:
            prepared = prepare(config, config)
            plan: dict[str, Any] | str = prepared.plan.to_json()
            problems = [p.detail() for p in prepared.problems]
            tier_bytes = prepared.plan.cpu_tier.bytes
            backend = prepared.plan.kv.backend
            disk_bytes, disk_path = prepared.plan.disk.bytes, prepared.plan.disk.path
        except VllmOffloadError as exc:
            plan = str(exc)
        return {
            "unit": f"{settings.unit}.service",
            "active_state": unit.active_state,
            "sub_state": unit.sub_state,
            "pid": unit.main_pid,
            "uptime_s": uptime,
            "health": health,
            "reason": reason,
            "model": config.model.path or "(demo model)",
            "served_name": launch.served_name(config, model_dir(config)),
            "plan": plan,
            "problems": problems,
            "events": list(monitor.watch.events),
            "wedge": wedge_status(monitor, config.manager),
            "tier": (
                {"available": False, "why": LMCACHE_CARD}
                if backend == "lmcache"
                else sampler.tier_card(tier_bytes)
            ),
            "disk": sampler.disk_card(disk_bytes, tier_status(disk_path)),
        }

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> str:
        """The manager's own view for Prometheus (Authorization: Bearer <token>)."""
        return wedge.prometheus_text(monitor.wedge, healthy=sampler.server_healthy)

    @app.get("/api/metrics")
    def metrics(since: float = Query(0.0, ge=0.0)) -> dict[str, Any]:
        return {"samples": sampler.since(since)}

    @app.post("/api/service/{action}")
    def control(action: Literal["start", "stop", "restart"]) -> dict[str, str]:
        if action != "stop":
            # Starting on a config that cannot be served only makes a crash loop: say why now.
            try:
                config = _load(settings)
                startable(config, config)
            except VllmOffloadError as exc:
                raise HTTPException(
                    409, {**exc.detail(), "refused": f"not {action}ing the server"}
                ) from None
            sampler.follow(server_url(config))
        try:
            getattr(settings.systemd, action)(settings.unit)
        except ServiceError as exc:
            raise HTTPException(502, str(exc)) from None
        finally:
            monitor.changed()
        return {"status": f"{action} requested"}

    @app.post("/api/cache/clear")
    def cache_clear() -> dict[str, Any]:
        """Empty the disk tier, as `vllm-offload cache clear` does: refused (409) while the
        server uses it."""
        config = _load(settings)
        files, removed = disk_layout.clear_tier(config.kv_offload.disk_path)
        return {"files": files, "bytes": removed}

    @app.get("/api/models")
    def models() -> dict[str, Any]:
        config = _load(settings)
        found = bounded.call(lambda: list_models(config), "manager.model_roots", "listing models")
        return {"roots": [str(r) for r in model_roots(config)], "models": found}

    @app.get("/api/config")
    def get_config(response: Response) -> dict[str, Any]:
        # The tag first: if the file changes in between, a save on this copy is refused
        # (409), never taken over a version the page did not show.
        response.headers["ETag"] = etag = config_mod.file_tag(settings.config_path)
        config = _load(settings)
        return {"config": config.model_dump(), "path": str(settings.config_path), "etag": etag}

    def from_api(
        body: ConfigBody,
    ) -> tuple[config_mod.DeploymentConfig, config_mod.DeploymentConfig]:
        """A config sent to the API, valid and inside the fence the saved file sets; and
        the saved one."""
        config, saved = config_mod.parse(body.config), _load(settings)
        fence.check(saved, config)
        return config, saved

    @app.post("/api/config/preview")
    def preview(body: ConfigBody) -> dict[str, Any]:
        prepared = prepare(*from_api(body))
        return {
            "plan": prepared.plan.to_json(),
            "problems": [p.detail() for p in prepared.problems],
        }

    @app.put("/api/config", status_code=202)
    def put_config(
        body: ConfigBody, if_match: str | None = Header(None, max_length=200)
    ) -> dict[str, Any]:
        config, saved = from_api(body)
        plan = startable(config, saved).plan
        with saving:
            if if_match is not None and if_match != config_mod.file_tag(settings.config_path):
                raise Refused(
                    "config",
                    "the config changed since you loaded it (saved from elsewhere); load it "
                    "again, then save",
                )
            try:
                config_mod.save(config, settings.config_path)
            except OSError as exc:
                raise HTTPException(507, f"could not save {settings.config_path}: "
                                         f"{exc.strerror}; the previous config is unchanged"
                                    ) from None  # fmt: skip
        sampler.follow(server_url(config))
        try:
            settings.systemd.restart(settings.unit)
        except ServiceError as exc:
            raise HTTPException(502, f"saved, but the restart failed: {exc}") from None
        finally:
            monitor.changed()
        return {"status": "saved; restarting", "plan": plan.to_json()}

    def served_by_the_unit(address: str, port: int) -> None:
        """Refuse (409) unless every socket a connection to ``address``:``port`` could
        reach belongs to the unit's server: the probe sends the API key, and any local
        user can listen on a port the stopped server left free (one did, took the key and
        answered 'healthy'), or on another address of the same name (``[::1]``)."""
        unit, _health = monitor.current()
        owners = reach.listener_uids(address, port)
        with suppress(psutil.NoSuchProcess):
            if unit.main_pid is not None and owners == {psutil.Process(unit.main_pid).uids().real}:
                return
        raise Refused(
            "server.port",
            f"a process listening on {address} port {port} is not {settings.unit}.service's "
            "server (another user's, or the unit is not running); the API key is not sent",
        )

    @app.post("/api/probe")
    def probe() -> dict[str, Any]:
        """Ask the running server one short chat question (confirms a switch worked)."""
        if not sampler.server_healthy and not sampler.probe_health():
            raise HTTPException(
                409,
                "the server is not running or not healthy yet; start it "
                "(POST /api/service/start) and wait for health",
            )
        config = _load(settings)
        address = reach.server_address(config)  # resolved once: checked, then connected to
        if config.server.api_key_file:
            served_by_the_unit(address, config.server.port)
        name = launch.served_name(config, model_dir(config))
        body = {"model": name, "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say hello."}]}  # fmt: skip
        key = launch.read_api_key(config)
        try:
            with VllmClient(reach.url(address, config.server.port), key) as server:
                response = server.post("/v1/chat/completions", body, PROBE_TIMEOUT_S)
                response.raise_for_status()
                answer = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise HTTPException(502, f"the server did not answer: {exc}") from None
        return {"model": answer.get("model"),
                "answer": answer["choices"][0]["message"]["content"]}  # fmt: skip

    @app.get("/api/logs")
    def logs(lines: int = Query(200, ge=1, le=5000)) -> dict[str, Any]:
        try:
            found = settings.systemd.logs(settings.unit, lines)
        except ServiceError as exc:
            raise HTTPException(502, str(exc)) from None
        if not found and not journal_readable():
            found = [JOURNAL_HINT]
        return {"lines": found}

    @app.get("/api/detect")
    def detect_servers() -> dict[str, Any]:
        return {"servers": detect.find_vllm_servers()}

    return app


JOURNAL_HINT = (
    "(nothing to show: the manager's user may not read the journal. Add it to the "
    "systemd-journal group to see the server's log here and the reason it stopped; "
    "systemd has no per-unit permission, so it then reads every unit's log.)"
)


def journal_readable() -> bool:
    """Whether this process may read other units' journal entries."""
    try:
        group = grp.getgrnam("systemd-journal").gr_gid
    except KeyError:
        group = None
    return os.geteuid() == 0 or (group is not None and group in os.getgroups())


def wedge_status(monitor: UnitMonitor, limits: config_mod.ManagerSection) -> dict[str, Any]:
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
