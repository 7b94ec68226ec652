"""Token auth for the manager: a bearer header, or a session cookie from the login
form. Requests that change state with a cookie also need the session's CSRF token
and a matching Origin; a bearer header is never sent by a browser on its own, so it
needs neither. Guessing the token is limited per client and per way of sending it
(throttle.py)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fastapi import Request

from vllm_offload.errors import Forbidden, Throttled, Unauthenticated
from vllm_offload.manager.throttle import Throttle, client_of

SESSION_COOKIE = "vllm_offload_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 12 * 3600
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
TOO_MANY = "too many wrong tokens from here; wait a minute and try again"


@dataclass(kw_only=True)
class Sessions:
    token: str
    _sessions: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> csrf, expiry
    guesses: Throttle = field(default_factory=Throttle)

    def check_guess(self, request: Request, way: str, candidate: str) -> bool:
        """Whether ``candidate`` is the token, sent ``way`` ('bearer', 'form') by this
        request's client; 429 without looking once that client and way used up their
        failures (the right token then fails too: a guesser learns nothing)."""
        right = self.check_token(candidate)
        if right and not self.guesses:  # nobody guessed lately: no client to look up
            return True
        client = client_of(request)
        if not self.guesses.allowed(client, way):
            raise Throttled("token", TOO_MANY)
        if right:
            return True
        self.guesses.failed(client, way)
        return False

    def check_token(self, candidate: str) -> bool:
        return secrets.compare_digest(candidate.encode(), self.token.encode())

    def create(self) -> tuple[str, str]:
        session_id, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._sessions[session_id] = (csrf, time.time() + SESSION_TTL_S)
        return session_id, csrf

    def csrf_for(self, session_id: str | None) -> str | None:
        if not session_id or session_id not in self._sessions:
            return None
        csrf, expiry = self._sessions[session_id]
        if expiry < time.time():
            del self._sessions[session_id]
            return None
        return csrf

    def drop(self, session_id: str | None) -> None:
        self._sessions.pop(session_id or "", None)


def origin_matches(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None:
        return False
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.netloc}" == f"{request.url.scheme}://{request.url.netloc}"


def authenticate(request: Request, sessions: Sessions) -> str:
    """'bearer' or 'session'; raises 401/403 with a body that says what to send."""
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and sessions.check_guess(request, "bearer", value.strip()):
            return "bearer"
        raise Unauthenticated(
            "Authorization",
            "wrong token: send Authorization: Bearer <token from the manager's token file>",
        )
    csrf = sessions.csrf_for(request.cookies.get(SESSION_COOKIE))
    if csrf is None:
        raise Unauthenticated(
            "Authorization",
            "authentication required: send Authorization: Bearer <token> or log in at /login",
        )
    if request.method in UNSAFE_METHODS:
        if not secrets.compare_digest(request.headers.get(CSRF_HEADER, "").encode(), csrf.encode()):
            raise Forbidden(CSRF_HEADER, f"missing or wrong {CSRF_HEADER} header for this session")
        if not origin_matches(request):
            raise Forbidden("Origin", "the Origin header is missing or names another site")
    return "session"
