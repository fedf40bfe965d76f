"""An experiment from the browser, end to end: Chromium fills the new-experiment form (the preview
counts the runs), launches it, and the experiment page fills in by itself while a real Celery
worker trains the trials (tiny random model, one step each): each seed's value appears with a link
to its run, then the arm's mean ± interval and the best arm, and the arm's learning curve, with no
reload.

The screenshot goes to $TROUPE_SCREENSHOTS (or the test's tmp folder): experiment-page.png."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from webapp.models import Experiment

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "optim: {steps: 1, tasks_per_step: 2}\ngrpo: {k: 2}\ngeneration: {max_new_tokens: 8}\nlora: {r: 2}\neval: {every: 1, size: 4}"


def test_the_experiment_page_fills_in_live(browser_page: Any, stack: Processes, alice: Member, tiny_world: TinyWorld, shots: Path):
    page = browser_page
    log_in(page, stack, alice)
    page.goto(stack.url + "/experiments/new/")
    page.select_option("#id_topology", str(tiny_world.topology.pk))
    page.select_option("#id_dataset", str(tiny_world.dataset.pk))
    page.fill("#id_name", "tiny lr")
    page.fill("#id_advanced_yaml", BASE)
    page.fill("#id_axes_yaml", "optim.lr: [1.0e-3]")
    page.fill("#id_seeds", "0, 1")
    page.locator("#id_seeds").dispatch_event("change")
    page.wait_for_selector("#preview-count:has-text('2 runs')")
    page.locator("button.primary", has_text="Launch experiment").click()
    page.wait_for_url(re.compile(r".*/experiments/\d+/$"))
    experiment = Experiment.objects.get()
    assert experiment.trial_count == 2

    # the worker trains both trials; the page's results part polls and fills in without a reload
    page.wait_for_selector("#best-arm", timeout=240_000)
    page.wait_for_selector("#trial-counts:has-text('2 succeeded')", timeout=240_000)
    text = page.locator("#arms").inner_text()
    assert "optim.lr=0.001" in text and "★" in text
    assert re.search(r"seed 0: \d\.\d{3}", text) and re.search(r"seed 1: \d\.\d{3}", text)
    assert re.search(r"\d\.\d{3} ± \d\.\d{3}", text)  # two seeds: an interval
    runs = list(experiment.runs.order_by("trial_index"))
    assert [r.status for r in runs] == ["succeeded", "succeeded"] and {r.to_config().seed for r in runs} == {0, 1}
    assert page.locator(f"#arms a[href='/runs/{runs[1].pk}/']").count() == 1
    # the learning curves follow the table's refreshes: one arm, its mean line and band drawn
    page.wait_for_selector("#experiment-curves[data-arms='1'] canvas", timeout=60_000)
    assert "held-out team.success" in page.locator("#curves-note").inner_text()
    page.screenshot(path=str(shots / "experiment-page.png"), full_page=True)
