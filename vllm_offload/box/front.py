"""The front door: one OpenAI port for several models. A request names its model; the front
door leases it from the switcher (waiting while it is brought in), forwards the request to
that model's engine over its unix socket and streams the answer back as it comes.

It answers only what an OpenAI client needs: ``GET /v1/models`` (every registered model,
with its state), the JSON routes of ``vllm_ext.forwarded_routes`` (routed by the body's
``model``), ``/health`` and ``/metrics`` (the engines' own, merged). Every request is
matched against that table by its raw path, before routing, a key check or a body read:
no decoding, no dot segments, nothing the engine could read as another route (the engine
URL is the table's entry, never the client's text). An engine refuses any other route to
what the front door forwards too (``ForwardedOnly``). With ``server.api_key_file`` set,
everything but ``/health`` and ``/metrics`` needs the key (``Authorization: Bearer``), as
vLLM's own server does; it is checked before any body is read, and a body is read up to
``MAX_BODY_BYTES`` as it arrives.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.requests import ClientDisconnect

from vllm_offload.box.engines import EngineProcess, uds_client
from vllm_offload.box.outlook import outlook
from vllm_offload.box.prometheus import merge_expositions
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Busy, Unavailable
from vllm_offload.vllm_ext.forwarded_routes import (
    FORWARDED_MARK,
    OPENAI_JSON_ROUTES,
    ASGIApp,
    Receive,
    Scope,
    Send,
)

# A request body the front door reads whole (to find its model): a long prompt as text or
# token ids is well under this. Counted as it arrives: a larger one costs at most this.
MAX_BODY_BYTES = 32 << 20
# Forwarded upstream (printable ASCII only); an engine gets no API key (its socket is the
# front door's alone) and never a client's own forwarded mark.
FORWARDED_HEADERS = ("content-type", "accept", "user-agent", "x-request-id")
DROPPED_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "date", "server"}
)
METRICS_TIMEOUT_S = 2.0
GET_ROUTES = frozenset({"/health", "/v1/models", "/metrics"})
ROUTES = frozenset({("GET", p) for p in GET_ROUTES} | {("POST", p) for p in OPENAI_JSON_ROUTES})
NOT_A_ROUTE = "not a route of this server: it serves GET /v1/models and POST " + ", ".join(
    sorted(OPENAI_JSON_ROUTES)
)


@dataclass(kw_only=True)
class FrontDoor:
    engines: Mapping[str, EngineProcess]
    residency: Residency
    max_model_len: Mapping[str, int]
    api_key: str | None = None
    ready: bool = False  # the default model is on the GPU: start-up is over
    created: int = field(default_factory=lambda: int(time.time()))
    _clients: dict[str, httpx.AsyncClient] = field(default_factory=dict)

    def client(self, name: str) -> httpx.AsyncClient:
        """One pooled client per engine: no read timeout (a long generation streams for
        minutes), a connect timeout for an engine that has gone."""
        if name not in self._clients:
            timeout = httpx.Timeout(None, connect=10.0)
            self._clients[name] = uds_client(self.engines[name].spec.socket, timeout)
        return self._clients[name]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()

    def state_of(self, name: str) -> str:
        """serving / asleep / stopped / starting / failed, as a person would say it."""
        slot = self.residency.slots[name]
        if slot.status in ("serving", "draining"):
            return "serving"
        engine = self.engines[name]
        if slot.status == "moving":
            return "starting" if engine.state in ("starting", "stopped", "failed") else "switching"
        return engine.state if engine.state in ("asleep", "failed") else "stopped"


def openai_error(status: int, message: str, kind: str, **headers: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class RoutesOnly:
    """ASGI middleware, outermost: a request whose method and raw path are not exactly one
    of the front door's routes is answered 404 (405 for a known path) here, before routing
    decodes the path (``%2f``, ``..``, ``%00``), a key check or a body read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # raw_path has no query (ASGI); some test transports append it.
        path = scope.get("raw_path", b"").partition(b"?")[0].decode("latin-1")
        method = "GET" if scope["method"] == "HEAD" else scope["method"]
        if (method, path) in ROUTES:
            await self.app(scope, receive, send)
            return
        if path in GET_ROUTES or path in OPENAI_JSON_ROUTES:
            takes = "GET" if path in GET_ROUTES else "POST"
            answer = openai_error(405, f"{path} takes {takes}", "BadRequestError")
        else:
            answer = openai_error(404, NOT_A_ROUTE, "NotFoundError")
        await answer(scope, receive, send)


def create_front_app(front: FrontDoor) -> FastAPI:
    app = FastAPI(title="vllm-offload front door", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(RoutesOnly)

    async def internal_error(_request: Request, _exc: Exception) -> Response:
        # The journal has the traceback; the client gets the one error body.
        return openai_error(
            500, "the front door failed on this request; its log says why", "InternalServerError"
        )

    app.add_exception_handler(Exception, internal_error)

    def authorised(request: Request) -> bool:
        if front.api_key is None:
            return True
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            value.strip().encode(), front.api_key.encode()
        )

    @app.get("/health")
    def health() -> Response:
        """200 once the default model serves (requests sent earlier wait for it)."""
        return Response(status_code=200 if front.ready else 503)

    @app.get("/v1/models", response_model=None)
    def models(request: Request) -> JSONResponse | dict[str, Any]:
        if not authorised(request):
            return openai_error(401, "a valid API key is required", "AuthenticationError")
        waits = outlook(front.residency)  # a client's readable signal while a model is away
        data = [
            {
                "id": name,
                "object": "model",
                "created": front.created,
                "owned_by": "vllm-offload",
                "max_model_len": front.max_model_len[name],
                "state": front.state_of(name),
                "expected_wait_s": waits[name]["expected_wait_s"],
            }
            for name in front.engines
        ]
        return {"object": "list", "data": data}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        texts = []
        for name, engine in front.engines.items():
            if engine.alive and engine.state in ("serving", "asleep"):
                try:
                    answer = await front.client(name).get("/metrics", timeout=METRICS_TIMEOUT_S)
                    texts.append(answer.text)
                except httpx.HTTPError:
                    continue
        return merge_expositions(texts)

    async def forward(request: Request) -> Response:
        if not authorised(request):
            return openai_error(401, "a valid API key is required", "AuthenticationError")
        # The engine's URL is the route's own entry (RoutesOnly matched the raw path to it).
        return await forward_request(front, request.scope["route"].path, request)

    for route in sorted(OPENAI_JSON_ROUTES):
        app.add_api_route(route, forward, methods=["POST"], response_model=None)
    return app


def forwarded_headers(request: Request) -> dict[str, str] | JSONResponse:
    """The client's headers the engine gets, or 400 naming one that is not printable
    ASCII (what an engine would read differently), or 415 for a body that is not JSON."""
    headers = {}
    for raw_name, raw_value in request.scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name not in FORWARDED_HEADERS:
            continue
        if any((b < 0x20 and b != 0x09) or b > 0x7E for b in raw_value):
            return openai_error(
                400, f"the {name} header must be printable ASCII", "BadRequestError"
            )
        headers[name] = raw_value.decode("ascii")
    media_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        return openai_error(
            415, "the body must be JSON: send Content-Type: application/json", "BadRequestError"
        )
    return headers | {FORWARDED_MARK: "1"}


async def read_body(request: Request) -> bytes | JSONResponse:
    """The body, counted as it arrives: 413 (and the connection closed, so the rest is
    never read) past MAX_BODY_BYTES, declared or sent."""
    too_large = openai_error(
        413,
        f"the request body is over {MAX_BODY_BYTES} bytes",
        "BadRequestError",
        Connection="close",
    )
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
        return too_large
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return too_large
    except ClientDisconnect:  # gone mid-body: nobody reads the answer
        return openai_error(400, "the client went away mid-body", "BadRequestError")
    return bytes(body)


def model_of(body: bytes, known: Mapping[str, object]) -> str | JSONResponse:
    """The model a request body names, or the OpenAI error that answers it."""
    names = ", ".join(sorted(known))
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # broken UTF-8 too; RecursionError: deep nesting
        return openai_error(400, "the body is not valid JSON", "BadRequestError")
    if not isinstance(data, dict):
        return openai_error(400, "the body must be a JSON object", "BadRequestError")
    name = data.get("model")
    if name is None:
        return openai_error(
            400, f'the request names no model: set "model" to one of: {names}', "BadRequestError"
        )
    if not isinstance(name, str):
        return openai_error(400, f'"model" must be a string, one of: {names}', "BadRequestError")
    if name not in known:
        return openai_error(
            404, f"the model '{name}' does not exist; this server has: {names}", "NotFoundError"
        )
    return name


async def forward_request(front: FrontDoor, route: str, request: Request) -> Response:
    """Lease the model (waiting while it is brought in), send the request to its engine and
    stream the answer back; the lease ends with the answer, or when the client goes."""
    headers = forwarded_headers(request)
    if isinstance(headers, JSONResponse):
        return headers
    body = await read_body(request)
    if isinstance(body, JSONResponse):
        return body
    name = model_of(body, front.engines)
    if isinstance(name, JSONResponse):
        return name
    lease = front.residency.lease(name)
    try:
        await lease.__aenter__()
    except Busy as exc:
        return openai_error(
            503, str(exc), "ServiceUnavailableError", **{"Retry-After": str(exc.retry_after_s)}
        )
    except Unavailable as exc:
        return openai_error(503, str(exc), "ServiceUnavailableError")
    client = front.client(name)
    upstream_request = client.build_request("POST", route, content=body, headers=headers)
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        await lease.__aexit__(None, None, None)
        return openai_error(
            502, f"the engine of '{name}' did not answer: {exc}", "ServiceUnavailableError"
        )
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the engine went away mid-answer: say so
            if streaming:
                message = f"the engine of '{name}' stopped answering: {exc}"
                error = {
                    "error": {"message": message, "type": "ServiceUnavailableError", "code": 502}
                }
                yield f"data: {json.dumps(error)}\n\n".encode()
        finally:  # also when the client goes away mid-stream
            await upstream.aclose()
            await lease.__aexit__(None, None, None)

    kept = {k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED_RESPONSE_HEADERS}
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
