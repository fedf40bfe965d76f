"""A person launches a run and keeps its page open, never reloading: every state the run goes
through reaches the page (queued, what the engine is doing now, finished), and every part of the
page agrees with it at the end: the buttons, the held-out results, the artifacts, the log. The
charts' axes read true: whole steps, a step axis as long as the run, exact value ticks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import launch, log_in, wait_for_status
from tests.processes import Processes
from webapp.models import Evaluation, LogLine, Run

pytestmark = pytest.mark.django_db(transaction=True)

WATCH = """() => {
  // Everything the phase line and the ETA said, in order (they change faster than a test polls).
  // (The summary card is swapped whole now and then: watch the live root, read the current elements.)
  window.seen = { phases: [], etas: 0 };
  new MutationObserver(() => {
    const line = document.getElementById("run-phase"), text = line.querySelector(".phase-detail").textContent;
    if (!line.hidden && window.seen.phases[window.seen.phases.length - 1] !== text) window.seen.phases.push(text);
    if (window.runLive.state.eta !== null && window.runLive.state.status === "running") window.seen.etas++;
  }).observe(document.getElementById("run-live"), { subtree: true, childList: true, characterData: true, attributes: true });
}"""

AXES = """() => Object.entries(window.runLive.charts).concat([["held-out", { u: window.troupeEvalChart }]]).map(([id, c]) => ({
  id, x: c.u.axes[0]._values, xSplits: c.u.axes[0]._splits, y: c.u.axes[1]._values, ySplits: c.u.axes[1]._splits,
  xRange: [c.u.scales.x.min, c.u.scales.x.max],
}))"""


def test_an_open_page_follows_the_run_from_queued_to_succeeded(web: Processes, alice: Member, tiny_world: TinyWorld,
                                                                browser_page: Any, shots: Path):
    page, stack = browser_page, web
    steps = 3
    log_in(page, stack, alice)
    run_id = launch(page, stack, tiny_world, steps=steps, eval_every=2)
    page.evaluate(WATCH)
    # The page watches before the run can start: no worker takes it until now.
    page.wait_for_selector("#run-live[data-conn=live][data-status=queued]", state="attached")
    stack.start_worker("browser")
    try:
        wait_for_status(page, "running", 180)
        page.wait_for_selector("#run-phase:not([hidden])", timeout=180_000)
        wait_for_status(page, "succeeded", 300)
        # the finished run's head (its secondary actions sit in the closed 'More actions' menu)
        page.wait_for_selector("#run-actions #run-more a:has-text('Try in playground')", state="attached", timeout=60_000)
        page.wait_for_function("() => !document.getElementById('held-out-note').dataset.empty", timeout=60_000)
        # the run's plan reached the open page when the engine reported it (no reload): the Execution line
        page.wait_for_selector("dd.plan:has-text('one process on cpu; HF generate; synchronous rollouts; queue gpu')",
                               state="attached", timeout=60_000)
    except Exception:
        page.screenshot(path=str(shots / "run-states-failure.png"), full_page=True)
        print(stack.logs())
        raise
    page.wait_for_timeout(500)
    page.screenshot(path=str(shots / "run-states-end.png"), full_page=True)

    seen = page.evaluate("() => window.seen")
    phases = seen["phases"]
    # what the engine was doing, as it did it: the step-0 evaluation with its progress, each step
    assert any(p.startswith("Evaluating at step 0 on ") and "0 of " in p and p.endswith("% of the work)") for p in phases), phases
    assert [p for p in phases if p.startswith("Training step")] == [f"Training step {s} of {steps}" for s in range(1, steps + 1)], phases
    assert any(p.startswith("Evaluating at step 2 on ") for p in phases), phases
    assert seen["etas"] > 0, "the engine's ETA should reach the page once a step has been timed"
    assert page.locator("#run-phase").is_hidden() and page.locator("#run-eta").inner_text() == ""
    # nothing about a finished run is "live" or "so far" any more
    assert page.locator("#run-live").get_attribute("data-conn") == "done" and page.locator("#live-conn").is_hidden()
    assert "so far" not in page.locator("#charts-missing").inner_text()

    # the page head: a finished run's buttons, the stale "Queued" note gone
    head = page.locator("#run-actions")
    assert head.locator("button", has_text="Stop").count() == 0
    assert head.locator("button", has_text="Archive").count() == 1 and head.locator("a", has_text="Try in playground").count() == 1
    # the menu opens on a click and shows them
    assert head.locator("a", has_text="Try in playground").is_hidden()
    head.locator("#run-more summary").click()
    assert head.locator("a", has_text="Try in playground").is_visible() and head.locator("button", has_text="Archive").is_visible()
    assert page.locator(".flash li", has_text="Queued run").count() == 0
    # held-out results, artifacts and the evaluate form as the database has them
    evaluations = Evaluation.objects.filter(run_id=run_id)
    assert page.locator("#eval-table tbody tr").count() == evaluations.count() == 3  # steps 0, 2 and 3
    assert "none recorded yet" not in page.locator("#held-out-results h2").inner_text()
    assert page.locator("#artifacts-body h3", has_text=f"Checkpoint step {steps}").count() == 1
    assert page.locator("#eval-panel select[name=checkpoint] option", has_text=f"step {steps}").count() == 1
    # the log says what happened, one line per step, evaluation and phase
    log = page.locator("#log-tail").inner_text()
    for s in range(1, steps + 1):
        assert f"step {s}/{steps}: reward" in log
    assert "held-out at step 0" in log and "checkpoint saved at step 3" in log
    assert page.locator("#log-tail span[data-id]").count() == LogLine.objects.filter(run_id=run_id).count()
    assert Run.objects.get(pk=run_id).phase == ""

    # the charts: whole steps on every x axis, the held-out one from step 0 to the last, exact value ticks
    for chart in page.evaluate(AXES):
        assert all(float(v) == int(v) for v in chart["x"]), chart
        assert all(abs(float(v) - s) <= 1e-9 * max(1, abs(s)) for v, s in zip(chart["y"], chart["ySplits"]) if v), chart
    held_out = next(c for c in page.evaluate(AXES) if c["id"] == "held-out")
    assert held_out["xRange"] == [0, steps]
    assert page.evaluate("() => window.troupeCharts.fmtTicks([0, 0.25, 0.5, 0.75, 1])") == ["0.00", "0.25", "0.50", "0.75", "1.00"]
