"""In Chromium against Daphne: log in, every page renders with the vendored htmx loaded, and the
htmx swaps work (environment hint, run config preview, run list filter), with no violation of the
Content-Security-Policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from tests.browser.conftest import assert_no_csp_violation, watch_csp
from tests.processes import Processes
from webapp.catalog import services as catalog

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture
def server(data_dir: Path, tmp_path: Path) -> Iterator[str]:
    procs = Processes(data_dir=data_dir, log_dir=tmp_path).start(worker=False)
    try:
        yield procs.url
    finally:
        procs.stop()


def test_it_serves_every_page_with_working_htmx(alice, alice_world, server, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM next to Playwright's event loop
    catalog.dataset_generator_create(team=alice.team, name="L2", environment="math_tool", env_args={"level": 2}, size=8, eval_size=2)
    w = alice_world
    pages = ["/", "/runs/", "/runs/new/", "/agents/", "/agents/new/", f"/agents/{w.tool.pk}/", "/topologies/",
             "/topologies/new/", f"/topologies/{w.topology.pk}/", "/datasets/", "/datasets/upload/", "/datasets/generate/",
             f"/datasets/{w.dataset.pk}/", "/models/", "/models/new/", f"/runs/{w.run.pk}/"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        context = browser.new_context(viewport={"width": 1366, "height": 800})
        violations = watch_csp(context)
        page = context.new_page()
        page.set_default_timeout(90_000)  # a safety net: a loaded machine is slow, every wait is on an event
        page.goto(server + "/")
        assert "/login/" in page.url and page.locator("#id_username").is_visible()
        # Log in with alice's test-client session (her password hash uses the tests' fast hasher,
        # which the server process does not load).
        cookie = alice.client.cookies[settings.SESSION_COOKIE_NAME].value
        context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": server}])

        for path in pages:
            response = page.goto(server + path)
            assert response is not None and response.status == 200, path
            assert page.evaluate("typeof window.htmx") == "object", path

        page.goto(server + "/topologies/new/")
        page.select_option("#id_environment", "arithmetic")
        page.wait_for_selector("#env-hint:has-text('solver')")

        page.goto(server + "/runs/new/")
        page.select_option("#id_topology", str(w.topology.pk))
        page.select_option("#id_dataset", str(w.dataset.pk))
        page.fill("#id_k", "5")
        page.locator("#id_k").dispatch_event("change")
        page.wait_for_selector("#preview pre.yaml:has-text('k: 5')")

        page.goto(server + "/runs/")
        page.select_option("select[name=status]", "failed")
        page.wait_for_selector("#runs-table td.empty")
        assert "status=failed" in page.url
        assert_no_csp_violation(page, violations)
        browser.close()
