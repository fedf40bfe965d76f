"""Issue 46 in Chromium: a resumed run's page offers no second Resume but the run that continues it,
and its head's buttons fit on one line at 1400 px (the secondary ones in a menu); the run form
follows the algorithm picked; the dashboard lists a queued job with its place in the jobs lane.
Daphne and its Redis, no worker: the rows are made in the database as a worker would leave them.

Screenshots go to $TROUPE_SCREENSHOTS (or the test's tmp folder): findings-*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_history_pages import finished_run
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from webapp.models import Job, Run

pytestmark = pytest.mark.django_db(transaction=True)

HEAD_ROWS = """() => {
  const items = Array.from(document.querySelectorAll('#run-actions > *')).filter(e => e.offsetParent);
  return new Set(items.map(e => Math.round(e.getBoundingClientRect().top))).size;
}"""


def test_the_pages_a_newcomer_tripped_on(web: Processes, alice: Member, tiny_world: TinyWorld, data_dir: Path,
                                         browser_page: Any, shots: Path):
    page = browser_page
    page.set_viewport_size({"width": 1400, "height": 900})
    original = finished_run(tiny_world, alice, data_dir, name="stopped early", lr=1e-4, slope=0.01, held_out=(0.1, 0.3))
    Run.objects.filter(pk=original.pk).update(status=Run.Status.CANCELLED)
    log_in(page, web, alice)

    # a cancelled run: one Resume, then (once resumed) the link to the run that continues it
    page.goto(web.url + original.get_absolute_url())
    assert page.locator("#run-actions button", has_text="Resume from step 40").count() == 1
    assert page.evaluate(HEAD_ROWS) == 1, "the head's buttons wrap"
    page.click("#run-more summary")
    assert page.locator("#warm-start").is_visible() and page.locator("#start-from-weights").is_visible()
    page.screenshot(path=str(shots / "findings-run-head-menu.png"))
    page.click("#run-actions button:has-text('Resume from step 40')")
    page.wait_for_url("**/runs/*/")
    resumed = Run.objects.get(resumed_from=original)
    assert page.url.endswith(resumed.get_absolute_url())
    assert "step 0 10%" in page.locator("#held-out-note").inner_text()  # its held-out results include the original's
    page.goto(web.url + original.get_absolute_url())
    assert page.locator("#run-actions", has_text="Resume from step").count() == 0
    assert page.locator("#continued-by").inner_text() == f"Continued in #{resumed.pk}"
    assert page.evaluate(HEAD_ROWS) == 1
    page.screenshot(path=str(shots / "findings-resumed-original.png"))

    # the run form follows the algorithm: GRPO's fields for GRPO, SFT's for SFT
    page.goto(web.url + "/runs/new/")
    assert page.locator("#field-k").is_visible() and page.locator("#field-sft_batch_size").is_hidden()
    page.select_option("#id_algorithm", "sft")
    assert page.locator("#field-k").is_hidden() and page.locator("#field-beta").is_hidden()
    assert page.locator("#field-sft_batch_size").is_visible() and page.locator("#field-conversations").is_visible()
    page.screenshot(path=str(shots / "findings-run-form-sft.png"), full_page=True)

    # a queued job is on the dashboard, with its place in the jobs lane
    job = Job.objects.create(team=tiny_world.team, owner=alice.user, kind=Job.Kind.EVALUATE, run=original,
                             params={"dataset_name": "gen"})
    page.goto(web.url + "/")
    row = page.locator(f"#dashboard-jobs tr[data-job='{job.pk}']")
    assert "Evaluation" in row.inner_text() and "#1" in row.inner_text()
    page.screenshot(path=str(shots / "findings-dashboard-jobs.png"), full_page=True)
