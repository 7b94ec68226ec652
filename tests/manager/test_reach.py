"""Issue #29, item 5: with server.host = "localhost" on a Debian-style host (localhost is
also ::1), another local user listening on [::1]:port got the probe's Bearer key while
the ownership check looked at the server's IPv4 socket. The manager resolves the host
once, to the address vLLM binds, checks every socket a connection there could reach, and
connects to that literal address."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.manager.conftest import BEARER, Env
from vllm_offload import config as config_mod
from vllm_offload.errors import Refused
from vllm_offload.manager import reach

pytestmark = pytest.mark.anyio
NOBODY = 65534

LISTENER = """
import http.server, os, socket, sys
socket.getfqdn("127.0.0.1")  # loads what it loads now: nobody cannot read root's Python
address, port = sys.argv[1], int(sys.argv[2])
class Server(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
if len(sys.argv) > 3:
    os.setgid(65534); os.setuid(65534)  # nobody, another local user: its socket
s = Server((address, port), type("H", (http.server.BaseHTTPRequestHandler,), {
    "do_GET": lambda self: (self.send_response(200), self.end_headers()),
    "do_POST": lambda self: (print("AUTH", self.headers.get("Authorization"), flush=True),
                             self.send_response(404), self.end_headers()),
    "log_message": lambda self, *a: None}))
print(s.server_address[1], flush=True)
s.serve_forever()
"""


@contextmanager
def listening(address: str, port: int, as_nobody: bool) -> Iterator[subprocess.Popen[str]]:
    """An HTTP listener on ``address``:``port``, root's or nobody's; it prints
    ``AUTH <header>`` for each POST."""
    args = [sys.executable, "-c", LISTENER, address, str(port), *(["nobody"] if as_nobody else [])]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        process.stdout.readline()
        yield process
    finally:
        process.kill()
        process.wait(timeout=30)


def debian_localhost(real: Any) -> Any:
    """getaddrinfo as on Debian: localhost is ::1 first, then 127.0.0.1."""

    def getaddrinfo(host: Any, port: Any, family: int = 0, *args: Any, **kw: Any) -> Any:
        if host != "localhost":
            return real(host, port, family, *args, **kw)
        both = real("::1", port, socket.AF_INET6, *args, **kw) + real(
            "127.0.0.1", port, socket.AF_INET, *args, **kw
        )
        return [a for a in both if family in (0, a[0])]

    return getaddrinfo


def free_port_on_both() -> int:
    with socket.socket(socket.AF_INET6) as six, socket.socket() as four:
        six.bind(("::1", 0))
        four.bind(("127.0.0.1", six.getsockname()[1]))
        return int(six.getsockname()[1])


def test_the_host_is_resolved_as_vllm_binds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", debian_localhost(socket.getaddrinfo))
    config = config_mod.DeploymentConfig()
    for host, address in [
        ("localhost", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1"),
        ("::", "::1"),
        ("::1", "::1"),
        ("127.0.0.1", "127.0.0.1"),
    ]:
        resolved = config_mod.with_overrides(config, {"server.host": host})
        assert reach.server_address(resolved) == address, host
    localhost = config_mod.with_overrides(config, {"server.host": "localhost"})
    assert reach.server_url(localhost) == "http://127.0.0.1:8000"


def test_every_socket_a_connection_could_reach_is_checked() -> None:
    port = free_port_on_both()
    with listening("127.0.0.1", port, as_nobody=False), listening("::1", port, as_nobody=True):
        assert reach.listener_uids("127.0.0.1", port) == {0}
        assert reach.listener_uids("::1", port) == {NOBODY}
    port = free_port_on_both()
    with listening("::", port, as_nobody=False):  # a dual-stack wildcard reaches IPv4 too
        assert reach.listener_uids("127.0.0.1", port) == {0}


async def test_the_key_goes_only_to_the_address_checked(
    client: httpx.AsyncClient, env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", debian_localhost(socket.getaddrinfo))
    port = free_port_on_both()
    key = tmp_path / "key"
    key.write_text("the-key")
    key.chmod(0o600)
    saved = config_mod.load(env.config_path)
    config_mod.save(
        config_mod.with_overrides(
            saved,
            {  # the administrator's own file
                "server.host": "localhost",
                "server.port": port,
                "server.api_key_file": str(key),
            },
        ),
        env.config_path,
    )
    assert (await client.post("/api/service/start", headers=BEARER)).status_code == 200
    with (
        listening("127.0.0.1", port, as_nobody=False) as server,  # the unit's user: root
        listening("::1", port, as_nobody=True) as intruder,
    ):
        response = await client.post("/api/probe", headers=BEARER)
        server.terminate()
        intruder.terminate()
        assert intruder.communicate(timeout=30)[0] == ""  # not even a request
        assert "AUTH Bearer the-key" in server.communicate(timeout=30)[0]
    assert response.status_code == 502  # the stand-in cannot chat


def test_a_host_that_does_not_resolve_still_lets_the_manager_start() -> None:
    config = config_mod.with_overrides(
        config_mod.DeploymentConfig(), {"server.host": "no-such-host.invalid"}
    )
    assert reach.server_url(config) == "http://no-such-host.invalid:8000"
    with pytest.raises(Refused, match="does not resolve"):
        reach.server_address(config)
