"""Issue #29, low: bearer guesses (the API, /metrics) were not limited (~1,500 a second),
while ten wrong form logins from anyone locked the right token out of the form for
everyone. Now each client has its own budget per way of sending the token; on loopback a
client is the local user owning the connection. Pages and the API are not cached."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.manager.conftest import TOKEN, Env, login
from vllm_offload.bench.server_process import free_port
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.manager.throttle import FAILURES_PER_MINUTE
from vllm_offload.upstream.client import wait_until

pytestmark = pytest.mark.anyio
ORIGIN = {"Origin": "http://testserver"}


@pytest.fixture
async def app(env: Env) -> AsyncIterator[object]:
    yield create_app(
        ManagerSettings(config_path=env.config_path, token=TOKEN, unit="vllm", systemd=env.systemd)
    )


def client_at(app: object, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://testserver")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def test_a_stranger_guessing_is_slowed_alone(app: object) -> None:
    async with client_at(app, "203.0.113.5") as stranger, client_at(app, "198.51.100.7") as admin:
        for _ in range(FAILURES_PER_MINUTE):
            assert (await stranger.get("/metrics", headers=bearer("guess"))).status_code == 401
        # the guesser learns nothing more, not even from the right token
        assert (await stranger.get("/api/status", headers=bearer(TOKEN))).status_code == 429
        assert (await stranger.get("/metrics", headers=bearer("guess"))).status_code == 429
        # the administrator, elsewhere, is not locked out
        assert (await admin.get("/metrics", headers=bearer(TOKEN))).status_code == 200
        for _ in range(FAILURES_PER_MINUTE):  # nor out of the form, by the stranger's
            wrong = await stranger.post("/login", data={"token": "guess"}, headers=ORIGIN)
            assert wrong.status_code == 401
        assert (
            await stranger.post("/login", data={"token": TOKEN}, headers=ORIGIN)
        ).status_code == 429
        csrf = await login(admin)
        assert csrf
        page = await admin.get("/")
        assert page.headers["cache-control"] == "no-store"  # it carries the CSRF token
        status = await admin.get("/api/status")
        assert status.status_code == 200 and status.headers["cache-control"] == "no-store"


GUESSER = """
import encodings.idna, http.client, os, sys
os.setgid(65534); os.setuid(65534)  # nobody: another local user
codes = []
for token in ["guess"] * int(sys.argv[2]) + [sys.argv[3]]:
    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
    conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + token})
    codes.append(conn.getresponse().status)
    conn.close()
print(codes)
"""


@pytest.fixture
def manager(env: Env, tmp_path: Path) -> Iterator[int]:
    """A real manager process on loopback; its port."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm_offload",
            "manager",
            "--port",
            str(port),
            "--token-file",
            str(token),
            "--config",
            str(env.config_path),
            "--systemd-root",
            str(env.root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 60, "the manager")
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_another_local_user_cannot_lock_the_administrator_out(manager: int) -> None:
    """Every local user reaches the manager from 127.0.0.1: the budget is per user."""
    guesser = subprocess.run(
        [sys.executable, "-c", GUESSER, str(manager), str(FAILURES_PER_MINUTE), TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    codes = guesser.stdout.strip()
    assert codes == str([401] * FAILURES_PER_MINUTE + [429]), guesser.stdout + guesser.stderr
    right = httpx.get(f"http://127.0.0.1:{manager}/metrics", headers=bearer(TOKEN), timeout=30)
    assert right.status_code == 200  # root, the administrator here
