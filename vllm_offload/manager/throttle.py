"""How often each client may send a wrong token, per way of sending it.

The first limit counted failed form logins from everyone together: ten wrong ones locked
the right token out of the form for everyone, and bearer guesses (the API, /metrics)
were not limited at all (~1,500 a second). Now each (client, way) pair has its own
budget, so a stranger who guesses is slowed alone. A client is its address (an IPv6
/64, which one host usually holds whole); on loopback, where every local user shares
127.0.0.1, it is the local user owning the connecting socket (/proc/net/tcp), so
another user on the host cannot lock the administrator out either. Behind a reverse
proxy on the same host every client is the proxy's user: give it its own authentication.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict, deque

from fastapi import Request

from vllm_offload.manager import reach

FAILURES_PER_MINUTE = 10
WINDOW_S = 60.0
MAX_CLIENTS = 4096  # remembered at once; the least recently failing are forgotten first


def client_of(request: Request) -> str:
    """Who is asking, as the throttle counts clients."""
    peer = request.client
    if peer is None:
        return "unknown"
    try:
        address = ipaddress.ip_address(peer.host)
    except ValueError:
        return peer.host  # a test client's name, or a Unix socket
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        server = request.scope.get("server")
        uid = reach.peer_uid((peer.host, peer.port), server) if server else None
        return f"local user {uid}" if uid is not None else "loopback"
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


class Throttle:
    """FAILURES_PER_MINUTE failures per (client, way) within WINDOW_S, then none until
    the oldest of them is a minute old."""

    def __init__(self) -> None:
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def __bool__(self) -> bool:
        """Whether any failure is remembered."""
        return bool(self._failures)

    def allowed(self, client: str, way: str) -> bool:
        recent = self._failures.get((client, way))
        if recent is None or len(recent) < FAILURES_PER_MINUTE:
            return True
        return time.monotonic() - recent[0] >= WINDOW_S

    def failed(self, client: str, way: str) -> None:
        key = (client, way)
        recent = self._failures.pop(key, None) or deque(maxlen=FAILURES_PER_MINUTE)
        recent.append(time.monotonic())
        self._failures[key] = recent  # the most recent failure last
        while len(self._failures) > MAX_CLIENTS:
            self._failures.popitem(last=False)
