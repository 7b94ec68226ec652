"""The routes a client may reach on an engine through the front door, once: the front door
forwards only these (matched against the raw request path), and each engine runs
``ForwardedOnly`` (vLLM's ``--middleware``), which refuses any other route to a request the
front door forwarded. So a flaw in the front door's matching still cannot reach an
engine's development routes (``/collective_rpc``, ``/sleep``, ...: vLLM opens them with
``VLLM_SERVER_DEV_MODE=1``, which sleep mode needs); only the runner's own connection,
which carries no mark, can.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

# vLLM's OpenAI (and Anthropic) JSON routes that name a model in their body. Multipart
# routes (audio) and the rest of /v1 (LoRA loading, response lookups) are not forwarded.
OPENAI_JSON_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/rerank",
        "/v1/score",
    }
)
# The header the front door sets on every request it forwards (a client's own is dropped:
# the front door forwards only the headers it names).
FORWARDED_MARK = "x-vllm-offload-forwarded"
MIDDLEWARE = f"{__name__}.ForwardedOnly"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def forwardable(method: str, raw_path: bytes) -> bool:
    """Whether a request, by its method and its path exactly as sent (no decoding, no dot
    segments: anything but the table's own bytes is refused), may reach an engine."""
    return method == "POST" and raw_path.decode("latin-1") in OPENAI_JSON_ROUTES


class ForwardedOnly:
    """ASGI middleware in each engine's vLLM server: a request bearing the front door's
    mark reaches only ``OPENAI_JSON_ROUTES``; others pass untouched (the runner's own
    calls)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        marked = any(
            name.lower() == FORWARDED_MARK.encode() for name, _ in scope.get("headers", ())
        )
        path = scope.get("raw_path") or scope.get("path", "").encode("latin-1", "replace")
        if scope["type"] == "http" and marked and not forwardable(scope["method"], path):
            error = {"message": "not a route the front door forwards", "type": "NotFoundError"}
            body = json.dumps({"error": error | {"code": 404}}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 404,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
