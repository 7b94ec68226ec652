"""What one HTTP server of ours gives slow and many clients (issues #15 and #55): uvicorn's
h11 protocol, bounded. uvicorn waits for ever for a request head, and its keep-alive timer
is re-armed by every byte, so connections that trickle (a slow-loris, one byte every few
seconds) or never send anything held the server's file descriptors until no one else got
in; and ``limit_concurrency`` answered 503 to every client once that many were open.

- **Each request must arrive in time**: its head within ``head_s`` of the moment the
  server began waiting for it (the connection opened, or the previous response ended),
  its body within ``body_s`` after the head. Bytes that trickle do not extend either:
  the connection is closed at the deadline.
- **Connections are counted**: past ``max_open`` open connections, or ``max_per_source``
  from one address, a new connection is answered 503 and closed at once (and leaves the
  count at once), so one source cannot hold the others out and the process stays below
  its LimitNOFILE: ``max_open`` is at most half the process's open-file limit (the rest:
  the engines' sockets, logs, the model's files) and ``max_per_source`` at most a quarter
  of ``max_open``.

- **A deadline never closes on a request waiting in the socket**: an event loop polls
  its sockets, then runs the timers that came due. Held up between the two (a box whose
  CPU is taken: CI's manager was held ~20 s at a time while vLLM decoded on 2 CPUs), it
  ran the keep-alive and head deadlines of connections whose next request had arrived
  meanwhile; closed with that request unread, the kernel answered it with a reset. So a
  deadline first asks the socket whether bytes wait unread: the keep-alive then leaves
  the connection to the read that comes, the head deadline lets the loop read once
  (``READ_FIRST_S``) and closes only if the head is still owed. Bytes that come between
  that question and the close remain the race every kept connection has (RFC 9112
  9.3.1: a client may resend; browsers do).

``protocol(limits)`` is the class uvicorn's ``http=`` takes (one per server).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import resource
import select
from dataclasses import dataclass, replace

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


@dataclass(frozen=True, kw_only=True)
class ConnectionLimits:
    head_s: float
    body_s: float
    max_open: int
    max_per_source: int


# The manager (LimitNOFILE 4096): small JSON bodies; a page, a few scripts and a person.
MANAGER = ConnectionLimits(head_s=10.0, body_s=30.0, max_open=256, max_per_source=64)
# The front door of several models (LimitNOFILE 65536, one more descriptor per forwarded
# request): bodies up to 32 MiB of prompt; a team, or a router or benchmark from one
# address; clients keep a connection 30 s between requests (uvicorn's keep-alive there).
FRONT_DOOR = ConnectionLimits(head_s=30.0, body_s=60.0, max_open=4096, max_per_source=1024)

# Long enough that the loop polls its sockets before the head deadline decides (a timer
# of 0 s could run in the same pass); short enough that a trickle gains nothing from it.
READ_FIRST_S = 0.01

TOO_MANY = b"too many connections; try again shortly\n"
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: "
    + str(len(TOO_MANY)).encode()
    + b"\r\n\r\n"
    + TOO_MANY
)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with ``limits`` (a subclass per server sets them)."""

    limits: ConnectionLimits = MANAGER
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._over_limits():
            # Out of the count now, not when its close lands a turn of the loop later: a
            # burst of refused connections would otherwise refuse the ones queued with it.
            self.connections.discard(self)
            transport.write(REFUSAL)
            transport.close()
            return
        self._arm(self.limits.head_s)

    def _over_limits(self) -> bool:
        if len(self.connections) > self.limits.max_open:
            return True
        host = _host(self)
        if host is None:  # a unix socket: its one client (the manager)
            return False
        return sum(1 for c in self.connections if _host(c) == host) > self.limits.max_per_source

    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._past_deadline)

    def _past_deadline(self) -> None:
        if self._unread():
            self._deadline = self.loop.call_later(READ_FIRST_S, self._close_if_owed)
        else:
            self._close_if_owed()

    def _close_if_owed(self) -> None:
        """Close the connection if the client still owes a head or a body."""
        owes = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
        if owes and not self.transport.is_closing():
            self.transport.close()

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's idle close, unless the next request waits to be read (the head
        deadline still bounds a connection that only trickles)."""
        if not self._unread():
            super().timeout_keep_alive_handler()

    def _unread(self) -> bool:
        """Whether the client's bytes wait in the socket, not yet read by the loop."""
        sock = self.transport.get_extra_info("socket")
        if sock is None or self.transport.is_closing():
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    def handle_events(self) -> None:
        before = self.conn.their_state
        super().handle_events()
        if before is h11.IDLE and self.conn.their_state is h11.SEND_BODY:
            self._arm(self.limits.body_s)  # the head is in: now its body

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # The next request's head; unless a pipelined one already came (its body is timed)
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm(self.limits.head_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)


def _host(protocol: object) -> str | None:
    """A connection's source: its client address, an IPv6 one's /64 (one client holds a
    whole /64); None on a unix socket."""
    client = getattr(protocol, "client", None)
    if not client:
        return None
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return str(client[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def within_open_files(limits: ConnectionLimits, open_files: int) -> ConnectionLimits:
    """``limits`` for a process that may hold ``open_files`` descriptors."""
    max_open = max(1, min(limits.max_open, open_files // 2))
    per_source = max(1, min(limits.max_per_source, max_open // 4))
    return replace(limits, max_open=max_open, max_per_source=per_source)


def protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """The protocol class for a server with ``limits``, within this process's open-file
    limit (RLIMIT_NOFILE, systemd's LimitNOFILE), its soft limit first raised to the hard
    one (as vLLM does for itself: a shell's 1,024 would cap a hand-run front door at 128
    connections an address)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    open_files = soft if soft != resource.RLIM_INFINITY else limits.max_open * 2
    bounded = within_open_files(limits, open_files)
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": bounded})
