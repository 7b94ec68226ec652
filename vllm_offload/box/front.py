"""The front door: one OpenAI port for several models. A request names its model; the front
door leases it from the switcher (waiting while it is brought in), forwards the request to
that model's engine over its unix socket and streams the answer back as it comes.

It answers only what an OpenAI client needs: ``GET /v1/models`` (every registered model,
with its state), the JSON routes of ``vllm_ext.forwarded_routes`` (routed by the body's
``model``), ``/health`` and ``/metrics`` (the engines' own, merged). What it checks before
forwarding (the raw path, the headers, the body, the model) is ``request_checks``. An
engine refuses any other route to what the front door forwards too (``ForwardedOnly``).
With ``server.api_key_file`` set, everything but ``/health`` and ``/metrics`` needs the key
(``Authorization: Bearer``), as vLLM's own server does; it is checked before any body is
read.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from vllm_offload.box.engines import EngineProcess, uds_client
from vllm_offload.box.outlook import outlook
from vllm_offload.box.prometheus import merge_expositions
from vllm_offload.box.request_checks import (
    RoutesOnly,
    forwarded_headers,
    model_of,
    openai_error,
    read_body,
)
from vllm_offload.box.residency import Residency
from vllm_offload.box.residency_records import Busy, Unavailable
from vllm_offload.vllm_ext.forwarded_routes import OPENAI_JSON_ROUTES

DROPPED_RESPONSE_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "date", "server"}
)
METRICS_TIMEOUT_S = 2.0


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
        """One client per engine (a connection per request, at most 100 at once: more
        wait here): no read timeout (a long generation streams for minutes), a connect
        timeout for an engine that has gone."""
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
    held = contextlib.AsyncExitStack()  # the lease, then the engine's answer: closed in turn
    try:
        await held.enter_async_context(front.residency.lease(name))
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
        await held.aclose()
        return openai_error(
            502, f"the engine of '{name}' did not answer: {exc}", "ServiceUnavailableError"
        )
    held.push_async_callback(upstream.aclose)
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
        finally:  # also when the client goes away mid-stream: the answer, then the lease
            await held.aclose()

    kept = {k: v for k, v in upstream.headers.items() if k.lower() not in DROPPED_RESPONSE_HEADERS}
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
