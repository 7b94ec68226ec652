#!/usr/bin/env python3
"""The manager page's CPU-tier card showing a GPU run's numbers (issue #17). No browser
runs on the GPU host, so this renders here: the real manager (its units under a
systemctl3 root, as the browser tests run it) and the real page code, with the `tier`
field of /api/status replaced by a card `benchmarks/gpu/tier_card.py` computed on the
GPU host (the manager's own tier_report over vLLM's /metrics). Writes a PNG of the card.

    PYTHONPATH=. benchmarks/gpu/tier_card_page.py CARD_JSON PHASE_INDEX OUT.png
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from testkit import stack
from vllm_offload.model import demo as demo_model

TOKEN = "tier-card-page-token-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("card_json", type=Path, help="tier_card.json from tier_card.py")
    parser.add_argument("phase", type=int, help="which phase's card (0-based)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    card = json.loads(args.card_json.read_text())["phases"][args.phase]["card"]
    from playwright.sync_api import Route, expect, sync_playwright

    def with_gpu_card(route: Route) -> None:
        status = route.fetch().json()
        route.fulfill(json={**status, "tier": card})

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        demo_model.write(root / "models" / "demo", seed=0)
        deployment = stack.install(root, root / "models" / "demo")
        with stack.manager(root, deployment, TOKEN) as url, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path="/usr/bin/chromium", args=stack.CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1400})
            page.goto(url + "/login")
            page.fill("#token", TOKEN)
            page.click("button[type=submit]")
            page.route("**/api/status", with_gpu_card)
            page.goto(url + "/")
            expect(page.locator("#buying")).to_contain_text("Since start", timeout=60_000)
            # The card's table only: its TTFT rows come from this manager's live sampler
            # (no server here, so they are empty), the rest is the GPU run's card.
            page.locator("#buying").screenshot(path=str(args.out))
            browser.close()


if __name__ == "__main__":
    main()
