"""The manager: a thin FastAPI shell over the config, deployment.prepare, the systemd unit
and the metrics sampler. ``create_app`` only wires: the shared state (state.py), the
middleware (a body limit, the token before anything reads a body, the security headers),
one error body from the one error table, and the routers by concern (routes/). Every API
body, model folder and tier file is untrusted input (fence.py, bounded.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vllm_offload import config as config_mod
from vllm_offload.errors import TooLarge, VllmOffloadError
from vllm_offload.manager import page
from vllm_offload.manager.auth import authenticate
from vllm_offload.manager.routes import config, models, peers, service, session, status
from vllm_offload.manager.state import Manager, ManagerSettings

MAX_BODY_BYTES = 64 * 1024
# The routes that need the token (the login form, the page's static files and /healthz
# do not).
GUARDED_PREFIX, GUARDED = "/api/", ("/logout", "/metrics")


def error_body(exc: VllmOffloadError) -> JSONResponse:
    """One shape for every refusal, its status from one table (errors.OUTCOMES): 401 no
    token, 403 not the API's to change, 409 refused here, 413 too large, 422 bad input,
    429 too many wrong tokens, 502 the service manager or server failed, 507 disk full."""
    return JSONResponse({"detail": exc.detail()}, status_code=exc.http_status)


class BodyLimit:
    """413 for a body over ``max_bytes``: at once from its Content-Length, and while it
    arrives when it has none (chunked), before any handler has acted on it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = TooLarge("body", f"request body larger than {self.max_bytes} bytes")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await error_body(too_large)(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # FastAPI answers an HTTPException it meets
                raise HTTPException(too_large.http_status, too_large.detail())  # reading
            return message

        await self.app(scope, counted, send)


def create_app(settings: ManagerSettings) -> FastAPI:
    config_mod.sweep_temp_files(settings.config_path)  # left by a save that was killed
    manager = Manager(settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        manager.sampler.start()
        manager.monitor.start()
        yield
        manager.monitor.stop()
        manager.sampler.stop()

    # No /docs or /redoc: they load Swagger UI from a CDN. The schema is /openapi.json.
    app = FastAPI(title="vllm-offload manager", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.manager = manager

    @app.exception_handler(VllmOffloadError)
    async def refused(_request: Request, exc: VllmOffloadError) -> JSONResponse:
        return error_body(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """FastAPI's own (404, 405, a body cut short) in the same shape."""
        detail = (
            exc.detail
            if isinstance(exc.detail, dict)
            else {"field": "", "message": str(exc.detail)}
        )
        return JSONResponse({"detail": detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"][1:]) or "request"
        return JSONResponse({"detail": {"field": field, "message": first["msg"]}}, status_code=422)

    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES)

    @app.middleware("http")
    async def require_token(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # Before anything reads the body: an anonymous caller learns nothing, not even a 422.
        path = request.url.path
        if path.startswith(GUARDED_PREFIX) or path in GUARDED:
            try:
                authenticate(request, manager.sessions)
            except VllmOffloadError as exc:
                return error_body(exc)
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

    for routes in (session, status, config, service, models, peers):
        app.include_router(routes.router)
    return app


__all__ = ["ManagerSettings", "create_app"]
