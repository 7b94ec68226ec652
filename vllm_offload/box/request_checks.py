"""What the front door checks in a client's request before it forwards anything, each
refusal an OpenAI error body. Every request is matched against the route table by its raw
path, before routing, a key check or a body read (``RoutesOnly``): no decoding, no dot
segments, nothing the engine could read as another route (the engine URL is the table's
entry, never the client's text). Then the headers an engine gets (printable ASCII, a JSON
body), the body read up to ``MAX_BODY_BYTES`` as it arrives, and the model it names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

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
GET_ROUTES = frozenset({"/health", "/v1/models", "/metrics"})
ROUTES = frozenset({("GET", p) for p in GET_ROUTES} | {("POST", p) for p in OPENAI_JSON_ROUTES})
NOT_A_ROUTE = "not a route of this server: it serves GET /v1/models and POST " + ", ".join(
    sorted(OPENAI_JSON_ROUTES)
)


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
    media_type, *params = [p.strip().lower() for p in headers.get("content-type", "").split(";")]
    if media_type != "application/json":
        return openai_error(
            415, "the body must be JSON: send Content-Type: application/json", "BadRequestError"
        )
    charsets = {p.partition("=")[2].strip('"') for p in params if p.startswith("charset=")}
    if charsets - {"utf-8", "utf8"}:  # the engine would decode what the front door did not read
        return openai_error(
            415,
            "JSON is UTF-8: send Content-Type: application/json (charset=utf-8)",
            "BadRequestError",
        )
    # What was checked, as the engine gets it (not the client's own spelling of it).
    return headers | {"content-type": "application/json", FORWARDED_MARK: "1"}


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
