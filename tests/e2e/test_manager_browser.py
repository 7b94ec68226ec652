"""The manager in a real browser (Playwright driving Debian's chromium), against the demo
server under a real systemctl (systemctl3): log in, watch the charts, restart, switch
models, get refused. Saves artifacts/manager.png."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.server import free_port, server_env
from vllm_offload import demo_model, units
from vllm_offload.config import DeploymentConfig, save, with_overrides
from vllm_offload.service import Systemd

pytestmark = pytest.mark.e2e
BIN = Path(sys.executable).parent
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout_s}s")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, str]]:
    models = tmp_path / "models"
    demo_model.write(models / "demo-a", seed=0)
    demo_model.write(models / "demo-b", seed=1)
    port = free_port()
    config = tmp_path / "etc" / "config.toml"
    save(with_overrides(DeploymentConfig(), {
        "model.path": str(models / "demo-a"), "server.port": port,
        "gpu.kv_cache_memory_bytes": 64 << 20, "extra_args": ["--enforce-eager"],
        "manager.model_roots": [str(models)],
    }), config)  # fmt: skip
    state = tmp_path / "state"
    state.mkdir()
    root = tmp_path / "a" / "b" / "root"
    units.install(units.validate(units.InstallOptions(
        root=root, user="root", config=config, config_given=True, state_dir=state)))  # fmt: skip
    systemd = Systemd((str(BIN / "systemctl3"),), (str(BIN / "journalctl3"),), root)
    systemd.start("vllm")
    token_file = tmp_path / "token"
    token_file.write_text("browser-test-token-0123456789\n")
    manager_port = free_port()
    manager = subprocess.Popen(
        [sys.executable, "-m", "vllm_offload", "manager", "--port", str(manager_port),
         "--token-file", str(token_file), "--config", str(config),
         "--systemd-root", str(root)],
        env=server_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{manager_port}/healthz", 60)
        wait_http(f"http://127.0.0.1:{port}/health", 300)
        yield f"http://127.0.0.1:{manager_port}", token_file.read_text().strip()
    finally:
        manager.terminate()
        manager.wait(timeout=30)
        systemd.stop("vllm")


def test_manager_in_a_browser(stack: tuple[str, str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, token = stack
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(30_000)
        page.goto(url + "/")
        expect(page).to_have_url(url + "/login")
        page.fill("#token", token)
        page.click("button[type=submit]")
        expect(page).to_have_url(url + "/")

        # Charts update: samples arrive every second and the legends show numbers.
        expect(page.locator("#state")).to_have_text("healthy", timeout=60_000)
        first = page.evaluate("samples.length")
        page.wait_for_timeout(3000)
        assert page.evaluate("samples.length") >= first + 2
        expect(page.locator("#l4")).to_contain_text("now:")

        # Restart from the page: a new PID, healthy again.
        pid_before = page.evaluate("fetch('/api/status').then(r => r.json()).then(s => s.pid)")
        page.click("#restart")
        expect(page.locator("#control-msg")).to_contain_text("restart requested")
        page.wait_for_function(
            f"fetch('/api/status').then(r => r.json()).then(s => s.pid && s.pid !== {pid_before}"
            " && s.health === 'healthy')", timeout=300_000, polling=2000,
        )  # fmt: skip

        # A refused form: nothing is written, the field is named.
        page.fill("#f-util", "2")
        page.click("#preview")
        expect(page.locator("#form-error")).to_contain_text("gpu.memory_utilization")
        page.fill("#f-util", "0.9")

        # Switch to the second model and see it answer.
        page.select_option("#f-model", label="demo-b")
        page.click("#save")
        expect(page.locator("#switched")).to_contain_text("demo-b answers", timeout=300_000)
        expect(page.locator("#server")).to_contain_text("demo-b", timeout=10_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ARTIFACTS / "manager.png"), full_page=True)
        browser.close()
