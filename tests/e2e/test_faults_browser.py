"""Faults as the manager page shows them (issue #8): kill -9 of the server and its recovery,
then a crash loop (the weights file deleted) that the service manager stops at the unit's
start limit. The rendered units run under systemctl3 as init (it supervises only so:
Restart=, the start limit), the demo server on CPU, Playwright driving Debian's chromium.
Saves artifacts/manager-start-limit.png."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit import stack as deploy
from testkit.stack import ARTIFACTS, CHROMIUM_ARGS, SYSTEMCTL3, wait_server
from vllm_offload.model import demo as demo_model
from vllm_offload.systemd.control import Systemd

pytestmark = pytest.mark.e2e
TOKEN = "faults-test-token-0123456789"


def start_limit_in_service_section(unit_file: Path) -> None:
    """docker-systemctl-replacement reads StartLimitBurst/StartLimitIntervalSec from
    [Service], systemd from [Unit], where the rendered unit has them (and where
    `systemd-analyze verify` checks them, tests/test_units.py): copy them over, values
    unchanged, so the replacement enforces the unit's own limit instead of its default."""
    text = unit_file.read_text()
    keys = [
        line
        for line in text.splitlines()
        if line.startswith(("StartLimitBurst=", "StartLimitIntervalSec="))
    ]
    assert keys == ["StartLimitIntervalSec=600", "StartLimitBurst=5"], keys
    unit_file.write_text(text.replace("[Service]\n", "[Service]\n" + "\n".join(keys) + "\n", 1))


@dataclass(kw_only=True)
class Stack:
    manager_url: str
    model_dir: Path
    systemd: Systemd
    config: Path


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Stack]:
    model = demo_model.write(tmp_path / "models" / "demo")
    deployment = deploy.install(tmp_path, model)
    root = deployment.root
    start_limit_in_service_section(root / "etc/systemd/system/vllm.service")
    init = subprocess.Popen(
        [SYSTEMCTL3, f"--root={root}", "--init", "start", "vllm.service"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with deploy.manager(tmp_path, deployment, TOKEN) as url:
            wait_server(deployment.server_port)
            yield Stack(
                manager_url=url,
                model_dir=model,
                systemd=deployment.systemd,
                config=deployment.config,
            )
    finally:
        subprocess.run([SYSTEMCTL3, f"--root={root}", "stop", "vllm.service"], timeout=120)
        os.killpg(init.pid, signal.SIGTERM)
        init.wait(timeout=60)


@pytest.mark.timeout(900)  # ~6 min here: each failing start loads vLLM for ~55 s
def test_kill_9_then_a_crash_loop_on_the_page(supervised: Stack) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, systemd = supervised.manager_url, supervised.systemd
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)  # a busy 2-core box: wait on conditions, generously
        page.goto(url + "/login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        state, events = page.locator("#state"), page.locator("#events")
        expect(state).to_have_text("healthy", timeout=60_000)

        # kill -9: the page shows the crash, the unit restarts the server, the page shows
        # it answering again (events are newest first).
        first = systemd.status("vllm").main_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        expect(events).to_contain_text(f"server process {first} is gone", timeout=30_000)
        expect(state).to_have_text("healthy", timeout=300_000)
        lines = events.inner_text().splitlines()
        gone = next(i for i, line in enumerate(lines) if f"server process {first} is gone" in line)
        assert any(line.endswith("-> healthy") for line in lines[:gone]), lines
        second = systemd.status("vllm").main_pid
        assert second not in (None, first)

        # The weights file is gone (a bad copy, a full disk): each restart plans, starts
        # vLLM and dies loading the model, a crash loop.
        (supervised.model_dir / "model.safetensors").unlink()
        os.kill(second, signal.SIGKILL)
        expect(state).to_have_text("crash-loop", timeout=420_000)
        expect(events).to_contain_text("crash loop: 3 server processes ended before answering")

        # The unit's start limit (5 starts in 10 minutes) ends it: no more restarts.
        expect(state).to_have_text("start-limit", timeout=240_000)
        server = page.locator("#server")
        expect(server).to_contain_text("stopped restarting it (the unit's start limit)")
        expect(server).to_contain_text("model weights")
        seen = events.inner_text()
        page.wait_for_timeout(20_000)  # four restart intervals (RestartSec=5)
        assert systemd.status("vllm").main_pid is None
        assert events.inner_text() == seen  # no new process came and went
        expect(state).to_have_text("start-limit")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "manager-start-limit.png"), full_page=True)
        browser.close()
