#!/usr/bin/env python
"""Screenshot every Troupe page of a running instance with Debian's Chromium (Playwright).

    .venv/bin/python scripts/screenshots.py [--url http://127.0.0.1:8000] [--user admin --password admin] [--out shots]

Logs in, then visits the dashboard, lists, forms, and the detail page of the first object of
each kind it finds; writes one PNG per page (laptop viewport, full page).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def first_link(page: Page, url: str, pattern: str) -> str | None:
    page.goto(url)
    for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
        if re.fullmatch(pattern, href or ""):
            return href
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--user", default="admin")
    parser.add_argument("--password", default="admin")
    parser.add_argument("--out", default="shots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = args.url.rstrip("/")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 800})
        page.goto(f"{base}/login/")
        page.screenshot(path=out / "00-login.png", full_page=True)
        page.fill("#id_username", args.user)
        page.fill("#id_password", args.password)
        page.click("button.primary")
        page.wait_for_load_state()

        pages = {
            "01-dashboard": "/", "02-runs": "/runs/", "03-run-new": "/runs/new/", "04-topologies": "/topologies/",
            "05-topology-new": "/topologies/new/", "06-agents": "/agents/", "07-agent-new": "/agents/new/",
            "08-datasets": "/datasets/", "09-dataset-upload": "/datasets/upload/", "10-dataset-generate": "/datasets/generate/",
            "11-models": "/models/", "16-storage": "/storage/", "17-workers": "/workers/", "18-members": "/team/members/", "19-password": "/account/password/",
            "20-audit": "/team/audit/", "21-tokens": "/account/tokens/",
        }
        details = {
            "12-run-detail": ("/runs/", r"/runs/\d+/"),
            "13-topology-edit": ("/topologies/", r"/topologies/\d+/"),
            "14-agent-edit": ("/agents/", r"/agents/\d+/"),
            "15-dataset-detail": ("/datasets/", r"/datasets/\d+/"),
        }
        for name, (listing, pattern) in details.items():
            href = first_link(page, base + listing, pattern)
            if href:
                pages[name] = href
        for name, path in pages.items():
            page.goto(base + path)
            page.wait_for_load_state("networkidle")
            page.screenshot(path=out / f"{name}.png", full_page=True)
            print(f"{out / name}.png  {path}")
        browser.close()


if __name__ == "__main__":
    main()
