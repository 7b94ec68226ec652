"""Issue #38 item 3 on the page: "Fetch a Hugging Face model" shows the download's
progress while it runs, then the model joins the list to choose from. The manager is a
real process, the hub is on loopback (paused halfway so the page is seen mid-download)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit import stack
from testkit.stack import CHROMIUM_ARGS
from tests.hub_server import Hub, serve_hub
from tests.model.test_hub import _repo
from vllm_offload import config as config_mod

pytestmark = pytest.mark.e2e
TOKEN = "hub-page-token-0123456789"


def test_the_page_fetches_a_hub_model_with_its_progress(tmp_path: Path, demo_dir: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    hub = Hub(repos={"org/tiny": _repo()}, pause_after=11 * 1024 * 1024)
    deployment = stack.install(tmp_path, demo_dir)
    saved = config_mod.load(deployment.config)
    config_mod.save(
        config_mod.with_overrides(saved, {"manager.hub_models": ["org/*"]}), deployment.config
    )
    with serve_hub(hub) as endpoint:
        env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1"}
        with stack.manager(tmp_path, deployment, TOKEN, env) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(url + "/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.fill("#h-model", "other/model")
            page.click("#h-fetch")
            expect(page.locator("#hub-pulls")).to_contain_text("manager.hub_models")
            page.fill("#h-model", "org/tiny")
            page.click("#h-fetch")
            expect(page.locator("#hub-pulls")).to_contain_text("fetching: 0.01 of 0.02 GiB")
            hub.go.set()
            expect(page.locator("#hub-pulls")).to_contain_text("fetched into")
            expect(
                page.locator("#f-model option", has_text="org/tiny (Hugging Face)")
            ).to_have_count(1)
            browser.close()


def test_the_page_fetches_a_hub_model_with_several_models(tmp_path: Path, demo_dir: Path) -> None:
    """With several models ([[models]]) the settings card is hidden (each model has its
    card); the fetch was inside it, so it could not be reached. It is its own card, and a
    fetched model joins "Add a model"."""
    from playwright.sync_api import expect, sync_playwright

    hub = Hub(repos={"org/tiny": _repo()})
    deployment = stack.install(tmp_path, demo_dir)
    saved = config_mod.load(deployment.config)
    data = saved.model_dump()
    data["models"] = [
        {"path": str(demo_dir), "served_name": "chat"},
        {"path": str(demo_dir), "served_name": "coder"},
    ]
    data["model"]["path"] = ""
    data["manager"]["hub_models"] = ["org/*"]
    config_mod.save(config_mod.parse(data), deployment.config)
    with serve_hub(hub) as endpoint:
        env = {"HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "0", "NO_PROXY": "127.0.0.1"}
        with stack.manager(tmp_path, deployment, TOKEN, env) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(url + "/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            expect(page.locator("#model-cards .model")).to_have_count(2)
            expect(page.locator("#settings-card")).to_be_hidden()
            expect(page.locator("#h-model")).to_be_visible()
            page.fill("#h-model", "org/tiny")
            page.click("#h-fetch")
            expect(page.locator("#hub-pulls")).to_contain_text("fetched into")
            expect(
                page.locator("#m-path option", has_text="org/tiny (Hugging Face)")
            ).to_have_count(1)
            browser.close()


def test_no_form_is_sent_before_the_page_script_handles_it(tmp_path: Path, demo_dir: Path) -> None:
    """CI once clicked Fetch before dashboard.js had taken the form: the browser sent the
    form itself, the page reloaded empty and the refusal never showed. The forms the script
    handles come with their buttons disabled; here the script never loads, so they stay so."""
    from playwright.sync_api import expect, sync_playwright

    deployment = stack.install(tmp_path, demo_dir)
    with stack.manager(tmp_path, deployment, TOKEN) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)
        page.route("**/static/dashboard.js", lambda route: route.abort())
        page.goto(url + "/login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        for button in ("#preview", "#m-add", "#h-fetch"):
            expect(page.locator(button)).to_be_disabled()
        browser.close()
