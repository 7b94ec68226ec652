"""Several models on the manager's page (issue #31), in a real browser against the front
door under systemctl3: two demo models, a card each with its state; bringing the other
in by hand switches them, and the events card records the switch. While the switch is
under way (a stop and a vLLM start: tens of seconds here) the page shows its progress and
the button says what it is doing (issue #43; artifacts/manager-switch-progress.png). A
host without a GPU gets one line instead of the GPU charts (the others have axes with
units, clock times whole inside the canvas and legends: artifacts/manager-charts.png), and
a card says what one request can use beside the pool's room. A strip shows the switches
of the last ten minutes, a lane per model (artifacts/manager-switch-strip.png), and the
CPU-tier card's figure says there is no tier here. vLLM's charts can show one model's view
(artifacts/manager-charts-coder.png). Saves artifacts/manager-models.png."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from testkit import stack as deploy
from testkit.stack import ARTIFACTS, CHROMIUM_ARGS, wait_server
from vllm_offload.config import load, parse, save
from vllm_offload.model import demo as demo_model

pytestmark = pytest.mark.e2e
TOKEN = "browser-test-token-0123456789"
# The CPU chart drawn at each second of the next two minutes (wherever its clock ticks
# fall), then as of now again: the clock labels under its x axis (textBaseline top) whose
# box leaves the canvas.
CLOCK_LABELS_OUTSIDE = """() => {
  const cv = document.getElementById('c4'), w = cv.clientWidth, outside = [];
  const draw = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y) {
    if (this.textBaseline === 'top') {
      const width = this.measureText(text).width;
      const left = x - width * ({center: 0.5, right: 1, end: 1}[this.textAlign] || 0);
      if (left < 0 || left + width > w) outside.push([text, left, left + width, w]);
    }
    return draw.call(this, text, x, y);
  };
  try {
    const start = Math.ceil(Date.now() / 1000 / TICK_S) * TICK_S;
    for (let s = 0; s < TICK_S; s += 1) drawChart(CHARTS[4], 4, start + s);
  } finally {
    CanvasRenderingContext2D.prototype.fillText = draw;
    drawCharts();  // as of now again
  }
  return outside;
}"""


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[str, int]]:
    models = tmp_path / "models"
    demo_model.write(models / "demo-a", seed=0)
    demo_model.write(models / "demo-b", seed=1)
    deployment = deploy.install(tmp_path, models / "demo-a")
    single = load(deployment.config).model_dump(exclude={"model"})
    save(
        parse(
            {
                **single,
                "models": [
                    {"path": str(models / "demo-a"), "served_name": "chat"},
                    {"path": str(models / "demo-b"), "served_name": "coder"},
                ],
                "residency": {"runtime_dir": str(tmp_path / "run")},
            }
        ),
        deployment.config,
    )
    deployment.systemd.start("vllm")
    try:
        with deploy.manager(tmp_path, deployment, TOKEN) as url:
            wait_server(deployment.server_port)
            yield url, deployment.server_port
    finally:
        deployment.systemd.stop("vllm")


def test_two_models_two_cards(stack: tuple[str, int]) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, port = stack
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.set_default_timeout(60_000)
        expect.set_options(timeout=60_000)  # a busy 2-core box: wait on conditions
        page.goto(url + "/login")
        page.fill("#token", TOKEN)
        page.click("button[type=submit]")
        expect(page).to_have_url(url + "/")
        cards = page.locator("#model-cards .model")
        expect(cards).to_have_count(2)
        chat, coder = cards.nth(0), cards.nth(1)
        expect(chat).to_contain_text("chat")
        expect(chat.locator(".badge")).to_have_text("serving")
        expect(chat).to_contain_text("default")
        expect(coder.locator(".badge")).to_have_text("stopped")
        expect(page.locator("#settings-card")).to_be_hidden()  # per model, in its card

        # No GPU here: one line says so, instead of four empty GPU charts.
        expect(page.locator("#no-gpu")).to_contain_text("No NVIDIA GPU found on this host")
        gpu_titles = page.locator("#charts .chart h3", has_text=re.compile("^GPU "))
        expect(gpu_titles).to_have_count(4)
        for title in gpu_titles.all():
            expect(title).to_be_hidden()
        expect(page.locator("#charts .chart h3", has_text="CPU (%)")).to_be_visible()

        # The charts: a unit on each axis, clock times under it, a legend naming each line.
        expect(page.locator("#charts h3", has_text="CPU (%)")).to_be_visible()
        expect(page.locator("#l4")).to_contain_text("now: all cores")
        expect(page.locator("#l5")).to_contain_text("RAM")
        expect(page.locator("#l5")).to_contain_text("swap")
        time = r"\d\d:\d\d( [AP]M)?"
        expect(page.locator("#c4")).to_have_attribute(
            "aria-label", re.compile(rf"^CPU, %, 0 to 100, from {time} to {time}$")
        )
        expect(page.locator("#c5")).to_have_attribute(
            "aria-label", re.compile(r"^RAM and swap used, GiB, 0 to ")
        )
        page.locator("#charts").screenshot(path=str(ARTIFACTS / "manager-charts.png"))
        # Each clock label lies whole inside its canvas (the last one was cut at the right
        # edge when its tick fell near it).
        assert page.evaluate(CLOCK_LABELS_OUTSIDE) == []
        # One model has served in the window yet: no per-model choice to make.
        expect(page.locator("#chart-model-pick")).to_be_hidden()

        # What one request can use (its max_model_len), beside the pool's room for one.
        plan = page.evaluate("fetch('/api/status').then(r => r.json()).then(s => s.models[0])")
        usable = min(plan["max_model_len"], plan["longest_request_tokens"])
        expect(chat.locator("tr", has_text="One request can use")).to_have_text(
            re.compile(rf"{usable:,} tokens \(max_model_len\)")
        )
        expect(chat.locator("tr", has_text="GPU KV pool room")).to_contain_text(
            f"{plan['longest_request_tokens']:,} tokens"
        )

        # The CPU tier's hit rate: none runs on a CPU host, and the figure says so.
        expect(page.locator("#hit-rate")).to_contain_text("No CPU tier")

        # Switches over time: a lane per model; chat's start at start-up is its first bar.
        strip = page.locator("#switch-strip")
        expect(strip.locator(".lane")).to_have_count(2)
        at = r"\d\d:\d\d:\d\d( [AP]M)?"
        expect(strip.locator(".lane[data-model=chat] .bar.bring-in")).to_have_attribute(
            "aria-label", re.compile(rf"^'chat' brought in at {at}, took [\d.,]+ s$")
        )
        expect(strip.locator(".lane[data-model=coder] .bar")).to_have_count(0)
        expect(strip.locator("#strip-axis")).to_contain_text("1 switch step in the last 10")

        coder.get_by_role("button", name="Bring in").click()  # a stop, then a start
        # A client asks coder meanwhile: its request waits for the switch.
        asking = ThreadPoolExecutor(1).submit(
            httpx.post,
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "coder", "prompt": "hello", "max_tokens": 2},
            timeout=600,
        )
        # Under way: the button counts the seconds, the card and the line over the cards
        # show the step, how long the last such step took, and the requests waiting.
        doing = coder.locator("button.bring-in")
        expect(doing).to_have_text(re.compile(r"Bringing in… [1-9]\d* s"), timeout=120_000)
        expect(doing).to_be_disabled()
        expect(coder.locator("tr", has_text="Switch under way")).to_contain_text("Bringing in for")
        expect(coder.locator("tr", has_text="Requests waiting")).to_contain_text("1")
        line = page.locator("#switch-progress")
        expect(line).to_contain_text("Bringing in 'coder': ")
        expect(line).to_contain_text("its first; 'chat' took ")  # chat's start, at start-up
        expect(line).to_contain_text("1 request waiting for a switch")
        expect(strip.locator(".lane[data-model=coder] .bar.under-way")).to_have_attribute(
            "aria-label", re.compile(r"^'coder' being brought in, for \d+ s so far$")
        )
        page.screenshot(path=str(ARTIFACTS / "manager-switch-progress.png"), full_page=True)
        expect(page.locator("#models-msg")).to_contain_text(
            "'coder' is serving",
            timeout=600_000,  # a CPU host: no GPU words (issue #56)
        )
        expect(coder.locator(".badge")).to_have_text("serving", timeout=30_000)
        expect(chat.locator(".badge")).to_have_text("stopped")
        expect(page.locator("#events")).to_contain_text("started 'coder'")
        assert asking.result().status_code == 200  # served once coder came in
        expect(coder.locator("button.bring-in")).to_have_text("Bring in")
        expect(line).to_be_hidden()
        # The strip now holds the whole switch: chat put away, coder brought in.
        expect(strip.locator(".bar.under-way")).to_have_count(0)
        expect(strip.locator(".lane[data-model=chat] .bar.put-away")).to_have_attribute(
            "aria-label", re.compile(rf"^'chat' put away at {at}, took [\d.,]+ s$")
        )
        expect(strip.locator(".lane[data-model=coder] .bar.bring-in")).to_have_attribute(
            "aria-label", re.compile(rf"^'coder' brought in at {at}, took [\d.,]+ s$")
        )
        expect(strip.locator("#strip-axis")).to_contain_text("3 switch steps in the last 10")
        strip.screenshot(path=str(ARTIFACTS / "manager-switch-strip.png"))

        # Per-model views: the window holds both models' samples; vLLM's charts show one.
        pick = page.locator("#chart-model")
        expect(pick.locator("option")).to_have_text(["all models", "chat", "coder"])
        pick.select_option("coder")
        expect(page.locator("#c6")).to_have_attribute(
            "aria-label", re.compile(r"^vLLM queue of 'coder', requests, 0 to ")
        )
        expect(page.locator("#h6")).to_have_text("vLLM queue of 'coder' (requests)")
        expect(page.locator("#l6")).to_contain_text("running 0 requests")
        page.locator("#charts").screenshot(path=str(ARTIFACTS / "manager-charts-coder.png"))
        pick.select_option("chat")  # stopped since the switch: no value now
        expect(page.locator("#l6")).to_contain_text("running \u2013")  # fmt of none
        expect(page.locator("#h4")).to_have_text("CPU (%)")  # the host's charts stay whole
        page.screenshot(path=str(ARTIFACTS / "manager-models.png"), full_page=True)
        browser.close()
