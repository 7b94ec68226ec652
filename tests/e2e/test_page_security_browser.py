"""The page as an attacker who can name a model folder would try it (issue #15): a folder
name that is HTML must show as text and run nothing, and the page forbids inline script."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from testkit import stack as deploy
from testkit.stack import CHROMIUM_ARGS
from vllm_offload.model import demo as demo_model

pytestmark = pytest.mark.e2e
TOKEN = "page-security-token-0123456789"
EVIL = "m<img src=x onerror=window.pwned=1>"


def test_a_model_folder_named_like_html_runs_nothing(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    models = tmp_path / "models"
    demo_model.write(models / "demo")
    shutil.copytree(models / "demo", models / EVIL)
    deployment = deploy.install(tmp_path, models / EVIL)  # the configured model: shown as-is
    with deploy.manager(tmp_path, deployment, TOKEN) as url:
        login = httpx.get(url + "/login")
        assert "script-src 'self'" in login.headers["content-security-policy"]
        assert "<script>" not in login.text and "style=" not in login.text
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page()
            page.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            page.goto(url + "/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            server = page.locator("#server")
            expect(server).to_contain_text(EVIL)  # the name, as text
            expect(page.locator("#f-model option", has_text=EVIL)).to_have_count(1)
            page.wait_for_timeout(2000)  # a second status poll, the model list loaded
            assert page.evaluate("window.pwned") is None
            assert page.locator("#server img").count() == 0
            browser.close()
