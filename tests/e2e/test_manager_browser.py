"""The manager in a real browser (Playwright driving Debian's chromium), against the demo
server under a real systemctl (systemctl3): log in, watch the charts, restart, switch
models, get refused. Saves artifacts/manager.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import stack as deploy
from testkit.stack import ARTIFACTS, CHROMIUM_ARGS, wait_server
from vllm_offload.model import demo as demo_model

pytestmark = pytest.mark.e2e
TOKEN = "browser-test-token-0123456789"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, str]]:
    models = tmp_path / "models"
    demo_model.write(models / "demo-a", seed=0)
    demo_model.write(models / "demo-b", seed=1)
    deployment = deploy.install(tmp_path, models / "demo-a")
    deployment.systemd.start("vllm")
    try:
        with deploy.manager(tmp_path, deployment, TOKEN) as url:
            wait_server(deployment.server_port)
            yield url, TOKEN
    finally:
        deployment.systemd.stop("vllm")


def test_manager_in_a_browser(stack: tuple[str, str]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, token = stack
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)  # a busy 2-core box: wait on conditions, generously
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
        # The CPU-tier card says what it cannot show, and why (no tier runs on a CPU host).
        expect(page.locator("#buying")).to_contain_text("this server has no CPU tier")
        # Its hit-rate figure says the same in words, and one model needs no per-model view.
        expect(page.locator("#hit-rate")).to_contain_text("No CPU tier: prompt tokens not in")
        expect(page.locator("#chart-model-pick")).to_be_hidden()
        expect(page.locator("#h6")).to_have_text("vLLM queue (requests)")

        # Restart from the page: a new PID, healthy again.
        pid_before = page.evaluate("fetch('/api/status').then(r => r.json()).then(s => s.pid)")
        page.click("#restart")
        # The call returns once systemctl has stopped the old server (vLLM drains first).
        expect(page.locator("#control-msg")).to_contain_text("restart requested", timeout=300_000)
        page.wait_for_function(
            f"fetch('/api/status').then(r => r.json()).then(s => s.pid && s.pid !== {pid_before}"
            " && s.health === 'healthy')",
            timeout=300_000,
            polling=2000,
        )

        # A refused form: nothing is written, the field is named.
        page.fill("#f-util", "2")
        page.click("#preview")
        expect(page.locator("#form-error")).to_contain_text("gpu.memory_utilization")
        page.fill("#f-util", "0.9")
        # A target instead of a knob (#18): 16 full-length requests at once; the preview says
        # what the planner chose for them (the 64 MiB pool holds 255 blocks of 128 tokens).
        page.fill("#f-conc", "16")
        page.click("#preview")
        expect(page.locator("#form-msg")).to_contain_text(
            "model.max_model_len auto -> 1,920: the longest the KV pool holds for 16 requests"
        )
        page.fill("#f-conc", "1")

        # Switch to the second model and see it answer.
        page.select_option("#f-model", label="demo-b")
        page.click("#save")
        expect(page.locator("#switched")).to_contain_text("demo-b answers", timeout=300_000)
        expect(page.locator("#server")).to_contain_text("demo-b", timeout=10_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ARTIFACTS / "manager.png"), full_page=True)
        browser.close()
