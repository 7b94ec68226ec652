"""Token auth for the manager: a bearer header, or a session cookie from the login
form. Requests that change state with a cookie also need the session's CSRF token
and a matching Origin; a bearer header is never sent by a browser on its own, so it
needs neither."""

from __future__ import annotations

import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

SESSION_COOKIE = "vllm_offload_session"
CSRF_HEADER = "X-CSRF-Token"
SESSION_TTL_S = 12 * 3600
UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
# Failed logins allowed per minute, from anyone: guessing the token is slowed to a crawl.
FAILED_LOGINS_PER_MINUTE = 10


@dataclass
class Sessions:
    token: str
    _sessions: dict[str, tuple[str, float]] = field(default_factory=dict)  # id -> csrf, expiry
    _failed_logins: deque[float] = field(
        default_factory=lambda: deque(maxlen=FAILED_LOGINS_PER_MINUTE)
    )

    def login_allowed(self) -> bool:
        """False while the last FAILED_LOGINS_PER_MINUTE failures are all within a minute."""
        full = len(self._failed_logins) == FAILED_LOGINS_PER_MINUTE
        return not (full and time.monotonic() - self._failed_logins[0] < 60)

    def login_failed(self) -> None:
        self._failed_logins.append(time.monotonic())

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
        if scheme.lower() == "bearer" and sessions.check_token(value.strip()):
            return "bearer"
        raise HTTPException(401, "wrong token: send Authorization: Bearer <token from the "
                                 "manager's token file>")  # fmt: skip
    csrf = sessions.csrf_for(request.cookies.get(SESSION_COOKIE))
    if csrf is None:
        raise HTTPException(401, "authentication required: send Authorization: Bearer <token> "
                                 "or log in at /login")  # fmt: skip
    if request.method in UNSAFE_METHODS:
        if not secrets.compare_digest(request.headers.get(CSRF_HEADER, "").encode(),
                                      csrf.encode()):  # fmt: skip
            raise HTTPException(403, f"missing or wrong {CSRF_HEADER} header for this session")
        if not origin_matches(request):
            raise HTTPException(403, "the Origin header is missing or names another site")
    return "session"
