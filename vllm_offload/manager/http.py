"""The manager's HTTP protocol: uvicorn's h11 one, which also closes a connection that
has not sent a whole request head within HEAD_TIMEOUT_S. uvicorn itself waits forever
for one, so idle or slowly-fed connections (half-open, slow-loris) held the manager's
file descriptors until it could accept no more."""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0


class HeadTimeoutProtocol(H11Protocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._close_without_request)

    def _close_without_request(self) -> None:
        if self.cycle is None and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer.cancel()
        super().connection_lost(exc)
