"""The run page draws every chart the server lists (`webapp.runs.series.CHARTS`, which the page carries
as JSON) and nothing else: a finished run with a point for every charted series, in Chromium. What
the engine reports is tied to that list in tests/webapp/runs/test_charted_metrics.py.

The screenshot goes to $TROUPE_SCREENSHOTS (or the test's tmp folder): run-page-charts.png."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from tests.webapp.history_helpers import add_evaluations, make_run
from webapp.models import MetricPoint, Run
from webapp.runs import services as run_services
from webapp.runs.series import AGENT_SERIES, CHARTS, REWARD_FN_PREFIX, RUN_SERIES

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 12


def finished_run(world: TinyWorld, member: Member) -> Run:
    """A finished run whose points hold every charted series (and a reward function's), run-wide and
    for both agents, with two held-out evaluations."""
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name="t", overrides={"optim.steps": STEPS})
    like: Any = SimpleNamespace(config_yaml=config.to_yaml(), topology=world.topology, dataset=world.dataset)
    run = make_run(world.team, like, name="every chart", owner=member.user, step=STEPS, total_steps=STEPS)
    now = timezone.now()
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run, step=s, time=now + timedelta(seconds=s),
                    values={**{key: 0.5 + 0.4 * ((s * (i + 3)) % 7) / 7 for i, key in enumerate(RUN_SERIES)},
                            f"{REWARD_FN_PREFIX}format_ok": s / STEPS},
                    agents={agent: {key: 0.2 + a * 0.3 + 0.05 * ((s + i) % 5) for i, key in enumerate(AGENT_SERIES)}
                            for a, agent in enumerate(("tool", "reasoner"))})
        for s in range(1, STEPS + 1)
    ])
    add_evaluations(run, [(0, 0.1, {"tool": 0.1, "reasoner": 0.05}), (STEPS, 0.4, {"tool": 0.4, "reasoner": 0.2})])
    return run


def test_it_draws_every_chart_the_server_lists(web: Processes, alice: Member, tiny_world: TinyWorld, browser_page: Any, shots: Path):
    run = finished_run(tiny_world, alice)
    page = browser_page
    log_in(page, web, alice)
    page.goto(web.url + run.get_absolute_url())
    page.wait_for_selector("#run-live[data-conn=done]", state="attached")  # the backlog is in
    want = [chart.id for chart in CHARTS]
    page.wait_for_function(f"() => Object.keys(window.runLive.charts).length === {len(want)}")
    drawn = page.evaluate("() => Array.from(document.querySelectorAll('#charts figure.chart:not([hidden])'))"
                          ".filter(f => f.querySelector('canvas')).map(f => f.id.slice('chart-'.length))")
    assert drawn == want  # every chart, in the server's order, and none of the script's own
    assert page.locator("#charts-missing").inner_text() == ""
    lines = page.evaluate("() => Object.fromEntries(Object.entries(window.runLive.charts).map(([id, c]) => [id, c.series.map(s => s.label)]))")
    assert lines["async-staleness"] == ["tool", "reasoner"] and lines["mismatch-weight"] == ["tool", "reasoner"]
    assert lines["adv-mean"] == ["tool", "reasoner"] and lines["async-wait"] == ["rollouts", "weights to the sampler"]
    assert lines["step-time"] == ["step", "rollout", "update"] and lines["reward-fns"] == ["format_ok"]
    page.locator("#charts-card").screenshot(path=str(shots / "run-page-charts.png"))
