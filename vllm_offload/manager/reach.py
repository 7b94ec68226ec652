"""Where the manager reaches the server, resolved once to the one address vLLM binds,
and who listens there.

vLLM 0.32 binds an IPv6 socket only for an IPv6 literal; any other host (``localhost``)
is bound as IPv4. The manager once connected to ``localhost`` by name: on a host where
that is also ``::1``, another local user listening on ``[::1]:port`` got the probe's
``Bearer`` key and fed the charts, while the ownership check looked at the IPv4 socket.
Now the manager checks, and connects to, the same literal address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path

from vllm_offload.config import DeploymentConfig
from vllm_offload.errors import Refused

# Wildcard binds are reached on loopback.
_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def server_address(config: DeploymentConfig) -> str:
    """The IP address the server of ``config`` listens on, as vLLM resolves its host."""
    host = config.server.host
    if host in _LOOPBACK:
        return _LOOPBACK[host]
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:  # a name: vLLM binds an IPv4 socket to it, so it takes the first IPv4 address
        found = socket.getaddrinfo(host, config.server.port, socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        raise Refused("server.host", f"{host} does not resolve here ({exc})") from None
    return str(found[0][4][0])


def url(address: str, port: int) -> str:
    return f"http://[{address}]:{port}" if ":" in address else f"http://{address}:{port}"


def server_url(config: DeploymentConfig) -> str:
    """The server's base URL for the charts, by the address it listens on. A host name
    that does not resolve here (yet) is kept as it is: nothing listens there now, and the
    manager must start all the same (the probe, which sends the key, resolves anew and
    refuses)."""
    try:
        return url(server_address(config), config.server.port)
    except Refused:
        return url(config.server.host, config.server.port)


def _address(hex_text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} writes it: 32-bit words in host (little) order."""
    raw = bytes.fromhex(hex_text)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _sockets() -> Iterator[tuple[Address, int, Address, int, str, int]]:
    """(local address, port, remote address, port, state, owner's uid) of every TCP
    socket, from /proc/net/tcp{,6}, which every user may read."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, _, local_port = fields[1].rpartition(":")
            remote, _, remote_port = fields[2].rpartition(":")
            yield (
                _address(local),
                int(local_port, 16),
                _address(remote),
                int(remote_port, 16),
                fields[3],
                int(fields[7]),
            )


def listeners(port: int) -> list[tuple[Address, int]]:
    """(address, owner's uid) of every TCP socket listening on ``port``."""
    return [(a, uid) for a, p, _r, _rp, state, uid in _sockets() if state == "0A" and p == port]


def peer_uid(peer: tuple[str, int], server: tuple[str, int]) -> int | None:
    """Who owns the connection from ``peer`` to ``server`` (both on this host): the uid
    of the socket whose local end is ``peer`` and remote end ``server``; None if none."""
    try:
        ends = (ipaddress.ip_address(peer[0]), ipaddress.ip_address(server[0]))
    except ValueError:  # not TCP over IP (a test's transport)
        return None
    want = (_plain(ends[0]), peer[1], _plain(ends[1]), server[1])
    for local, port, remote, remote_port, _state, uid in _sockets():
        if (_plain(local), port, _plain(remote), remote_port) == want:
            return uid
    return None


def _plain(address: Address) -> Address:
    """An IPv4 address mapped into IPv6 (a dual-stack socket's view) as IPv4."""
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return mapped or address


def listener_uids(address: str, port: int) -> set[int]:
    """The owners of every socket that a connection to ``address``:``port`` could reach:
    one bound to that address, its family's wildcard, or (IPv4) the IPv6 wildcard and
    the address mapped into IPv6."""
    target = ipaddress.ip_address(address)
    reach: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = {target}
    if isinstance(target, ipaddress.IPv4Address):
        reach |= {
            ipaddress.IPv4Address(0),
            ipaddress.IPv6Address(0),
            ipaddress.IPv6Address(f"::ffff:{target}"),
        }
    else:
        reach.add(ipaddress.IPv6Address(0))
    return {uid for local, uid in listeners(port) if local in reach}
