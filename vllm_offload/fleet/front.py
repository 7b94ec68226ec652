"""The front door: one OpenAI port for several models. A request names its model; the front
door leases it from the switcher (waiting while it is brought in), forwards the request to
that model's engine over its unix socket and streams the answer back as it comes.

It answers only what an OpenAI client needs: ``/v1/models`` (every registered model, with
its state), ``POST /v1/...`` (routed by the body's ``model``), ``/health`` and ``/metrics``
(the engines' own, merged). Nothing else of an engine is reachable through it, its
development routes above all. With ``server.api_key_file`` set, ``/v1/...`` needs the key
(``Authorization: Bearer``), as vLLM's own server does.
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

from vllm_offload.fleet.engines import EngineProcess, uds_client
from vllm_offload.fleet.outlook import outlook
from vllm_offload.fleet.prometheus import merge_expositions
from vllm_offload.fleet.residency import Busy, Residency, Unavailable

# A request body the front door reads whole (to find its model): a long prompt as text or
# token ids is well under this.
MAX_BODY_BYTES = 32 << 20
# Forwarded upstream; an engine gets no API key (its socket is the front door's alone).
FORWARDED_HEADERS = ("content-type", "accept", "user-agent", "x-request-id")
DROPPED_RESPONSE_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "date",
                                      "server"})  # fmt: skip
METRICS_TIMEOUT_S = 2.0


@dataclass
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


def create_front_app(front: FrontDoor) -> FastAPI:
    app = FastAPI(title="vllm-offload front door", docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip

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
        data = [{"id": name, "object": "model", "created": front.created,
                 "owned_by": "vllm-offload", "max_model_len": front.max_model_len[name],
                 "state": front.state_of(name),
                 "expected_wait_s": waits[name]["expected_wait_s"]}
                for name in front.engines]  # fmt: skip
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

    @app.post("/v1/{path:path}", response_model=None)
    async def forward(path: str, request: Request) -> Response:
        if not authorised(request):
            return openai_error(401, "a valid API key is required", "AuthenticationError")
        return await forward_request(front, path, request)

    return app


def model_of(body: bytes, known: Mapping[str, object]) -> str | JSONResponse:
    """The model a request body names, or the OpenAI error that answers it."""
    if len(body) > MAX_BODY_BYTES:
        return openai_error(413, f"request body over {MAX_BODY_BYTES} bytes", "BadRequestError")
    try:
        name = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return openai_error(400, "the body must be a JSON object", "BadRequestError")
    if name not in known:
        return openai_error(404, f"the model '{name}' does not exist; this server has: "
                            f"{', '.join(sorted(known))}", "NotFoundError")  # fmt: skip
    return str(name)


async def forward_request(front: FrontDoor, path: str, request: Request) -> Response:
    """Lease the model (waiting while it is brought in), send the request to its engine and
    stream the answer back; the lease ends with the answer, or when the client goes."""
    body = await request.body()
    name = model_of(body, front.engines)
    if isinstance(name, JSONResponse):
        return name
    lease = front.residency.lease(name)
    try:
        await lease.__aenter__()
    except Busy as exc:
        return openai_error(503, str(exc), "ServiceUnavailableError",
                            **{"Retry-After": str(exc.retry_after_s)})  # fmt: skip
    except Unavailable as exc:
        return openai_error(503, str(exc), "ServiceUnavailableError")
    client = front.client(name)
    headers = {k: v for k, v in request.headers.items() if k in FORWARDED_HEADERS}
    upstream_request = client.build_request(
        "POST", f"/v1/{path}", content=body, headers=headers, params=request.query_params
    )
    try:
        upstream = await client.send(upstream_request, stream=True)
    except httpx.HTTPError as exc:
        await lease.__aexit__(None, None, None)
        return openai_error(502, f"the engine of '{name}' did not answer: {exc}",
                            "ServiceUnavailableError")  # fmt: skip
    streaming = upstream.headers.get("content-type", "").startswith("text/event-stream")

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the engine went away mid-answer: say so
            if streaming:
                message = f"the engine of '{name}' stopped answering: {exc}"
                error = {"error": {"message": message, "type": "ServiceUnavailableError",
                                   "code": 502}}  # fmt: skip
                yield f"data: {json.dumps(error)}\n\n".encode()
        finally:  # also when the client goes away mid-stream
            await upstream.aclose()
            await lease.__aexit__(None, None, None)

    kept = {k: v for k, v in upstream.headers.items()
            if k.lower() not in DROPPED_RESPONSE_HEADERS}  # fmt: skip
    return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)
