"""Issue #38 item 5: the manager next to a server started by hand (`make serve`, a
`vllm-offload serve` in a terminal) with the unit down. The page showed `stopped`, the
config's model, an empty log and its own server under "Other vLLM servers"; now it shows
the server's own account and says what the manager cannot do for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e import stack
from tests.e2e.server import Server

pytestmark = pytest.mark.e2e
TOKEN = "hand-run-token-0123456789"


@pytest.fixture
def deployment(tmp_path: Path, demo_dir: Path) -> Iterator[stack.Deployment]:
    """The units installed (not started) and the same config served by hand."""
    deployment = stack.install(tmp_path, demo_dir)
    (tmp_path / "hand").mkdir()
    server = Server(["--config", str(deployment.config), "--model-served-name", "by-hand"],
                    tmp_path / "hand", port=deployment.server_port)  # fmt: skip
    server.start()
    try:
        yield deployment
    finally:
        server.stop()


def test_the_manager_shows_a_server_started_by_hand(
    tmp_path: Path, deployment: stack.Deployment
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with (
        stack.manager(tmp_path, deployment, TOKEN) as url,
        httpx.Client(base_url=url, headers=headers, timeout=30) as manager,
    ):
        status = manager.get("/api/status").json()
        assert status["health"] == "by-hand", status
        assert status["served_name"] == "by-hand"  # the server's own, not the config's
        assert status["hand_run"]["models"] == ["by-hand"]
        assert status["pid"] is not None and status["uptime_s"] is not None
        assert "started by hand" in status["reason"] and "vllm.service" in status["reason"]
        assert (
            manager.get("/api/logs")
            .json()["lines"][0]
            .startswith("(the server answering now was started by hand")
        )
        ports = [s["port"] for s in manager.get("/api/detect").json()["servers"]]
        assert deployment.server_port not in ports  # not an "other" server
