"""A person watching a real run: log in, launch a tiny-random run from the new-run form, and see
chart points, episodes and log lines arrive live until the status reads succeeded; then lose the
connection mid-run (Daphne killed and restarted) and find no step missing afterwards.

The runs hold at the start of their step 2 until the test opens a gate (`held_world`, `held_stack`):
the page is certainly watching a run mid-way, however fast the worker and however slow the browser."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.processes import Processes, wait_for
from webapp.models import LogLine, MetricPoint, Rollout, Run

pytestmark = pytest.mark.django_db(transaction=True)

TASKS_PER_STEP = 2


def log_in(page: Any, stack: Processes, member: Member) -> None:
    page.goto(stack.url + "/login/")
    page.fill("#id_username", member.user.username)
    page.fill("#id_password", member.password)
    page.locator("form button, form input[type=submit]").last.click()
    page.wait_for_url(re.compile(r".*/$"))


def launch(page: Any, stack: Processes, world: TinyWorld, *, steps: int, eval_every: int) -> int:
    """Fill the new-run form like a person and launch; returns the new run's id."""
    page.goto(stack.url + "/runs/new/")
    page.select_option("#id_topology", str(world.topology.pk))
    page.select_option("#id_dataset", str(world.dataset.pk))
    page.fill("#id_name", f"live tiny {steps} steps")
    for field, value in (("steps", steps), ("k", 4), ("tasks_per_step", TASKS_PER_STEP), ("max_new_tokens", 16),
                         ("lora_r", 4), ("eval_every", eval_every)):
        page.fill(f"#id_{field}", str(value))
    page.click("details.advanced > summary")
    page.fill("#id_advanced_yaml", "eval:\n  size: 4\n")
    page.click("button.primary:has-text('Launch run')")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def live_state(page: Any) -> dict[str, Any]:
    return page.evaluate("""() => ({
        steps: window.runLive.steps('reward/total'),
        reconnects: window.runLive.state.reconnects,
        liveSteps: window.runLive.state.timings.map(t => t[0]),
        episodes: Array.from(document.querySelectorAll('#episodes article.episode')).map(a => +a.dataset.id),
        logIds: Array.from(document.querySelectorAll('#log-tail span[data-id]')).map(s => +s.dataset.id),
        evalPoints: Object.keys(window.runLive.state.evals).length,
        charts: Array.from(document.querySelectorAll('#charts figure.chart:not([hidden]) canvas')).length,
        progress: document.querySelector('#run-progress .progress span').textContent,
        badge: document.querySelector('#run-status .badge').textContent.trim(),
    })""")


def wait_for_socket(page: Any, timeout_s: float = 30) -> None:
    """The page's socket is open: "live" while the run goes on, "done" once it has ended (a run can
    finish while the server is down, and then the reconnected page goes straight to "done")."""
    page.wait_for_selector("#run-live[data-conn=live], #run-live[data-conn=done]", state="attached",
                           timeout=timeout_s * 1000)


def wait_for_status(page: Any, status: str, timeout_s: float) -> None:
    page.wait_for_selector(f"#run-live[data-status={status}]", state="attached", timeout=timeout_s * 1000)


def wait_for_the_end(page: Any, run_id: int, steps: int) -> None:
    """Until the page holds what the database holds of a finished run: every step, every episode
    (fetched over HTTP after the socket announces them), every log line, the final progress."""
    episodes = Rollout.objects.filter(run_id=run_id).count()
    lines = LogLine.objects.filter(run_id=run_id).count()
    page.wait_for_function(f"() => window.runLive.steps('reward/total').length === {steps}", timeout=120_000)
    page.wait_for_function(f"() => document.querySelectorAll('#episodes article.episode').length === {episodes}", timeout=120_000)
    page.wait_for_function(f"() => document.querySelectorAll('#log-tail span[data-id]').length === {lines}", timeout=120_000)
    page.wait_for_selector(f"#run-progress .progress span:text-is('{steps}/{steps}')", timeout=120_000)
    page.wait_for_selector("#run-status .badge:text-is('Succeeded')", timeout=120_000)  # the summary card's refresh


def test_it_streams_a_real_run_into_the_page(held_stack: Processes, alice: Member, held_world: TinyWorld, browser_page: Any,
                                             shots: Path):
    page, stack = browser_page, held_stack
    steps = 4
    log_in(page, stack, alice)
    run_id = launch(page, stack, held_world, steps=steps, eval_every=2)
    wait_for_socket(page)
    try:
        wait_for_status(page, "running", 180)
        # The first step's points and episodes appear without a reload, while the run holds at step 2.
        page.wait_for_function("() => window.runLive.steps('reward/total').length >= 1", timeout=180_000)
        page.wait_for_selector("#chart-reward canvas")
        page.wait_for_selector("#episodes article.episode")
        mid = live_state(page)
        page.screenshot(path=str(shots / "run-live-mid.png"), full_page=True)
        assert mid["badge"] == "Running" and mid["charts"] >= 6
        assert mid["steps"] == [1], "the page watches the run mid-way: step 1 written, step 2 held"
        stack.open_gate()  # type: ignore[attr-defined]

        wait_for_status(page, "succeeded", 300)
        wait_for_the_end(page, run_id, steps)
        page.wait_for_function("() => Object.keys(window.runLive.state.evals).length >= 2", timeout=120_000)
    except Exception:
        page.screenshot(path=str(shots / "run-live-failure.png"), full_page=True)
        print(stack.logs())
        raise
    page.screenshot(path=str(shots / "run-live-end.png"), full_page=True)
    page.locator("#run-summary").screenshot(path=str(shots / "run-live-end-summary.png"))
    page.locator("#charts-card").screenshot(path=str(shots / "run-live-end-charts.png"))
    page.locator("#episodes article.episode").first.screenshot(path=str(shots / "run-live-end-episode.png"))

    end = live_state(page)
    run = Run.objects.get(pk=run_id)
    assert run.status == "succeeded" and end["badge"] == "Succeeded" and end["progress"] == f"{steps}/{steps}"
    assert end["steps"] == list(range(1, steps + 1))
    assert set(end["liveSteps"]) >= set(range(2, steps + 1)), "the steps after the page opened arrive as live deltas"
    assert sorted(end["episodes"], reverse=True) == list(Rollout.objects.filter(run=run).order_by("-id").values_list("id", flat=True))
    assert len(end["episodes"]) == steps * TASKS_PER_STEP
    assert end["logIds"] == list(LogLine.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    # Candidates with rewards and advantages, the chosen one marked, the tool's sandbox output.
    first = page.locator("#episodes article.episode").first
    assert first.locator("tr.candidate").count() >= 4 and first.locator("tr.candidate.chosen").count() >= 1
    assert first.locator(".tool-output").count() >= 1
    # The filter asks the server: solved episodes only.
    solved = Rollout.objects.filter(run=run, success=True).count()
    page.select_option("#rollout-filter select[name=success]", "yes")
    page.wait_for_function(f"() => document.querySelectorAll('#episodes article.episode').length === {solved}"
                           " && (document.querySelector('#episodes .episodes-empty') !== null) === " + ("true" if not solved else "false"))
    page.click("#filter-clear")
    page.wait_for_function(f"() => document.querySelectorAll('#episodes article.episode').length === {steps * TASKS_PER_STEP}")
    # Hover: the cursor moves in every chart (synchronized), legends show that step's values.
    page.locator("#chart-reward").scroll_into_view_if_needed()
    over = page.locator("#chart-reward .u-over").bounding_box()
    page.mouse.move(over["x"] + over["width"] * 0.02, over["y"] + over["height"] / 2)
    page.wait_for_function("() => window.runLive.charts.reward.u.cursor.idx === 0 && window.runLive.charts.len.u.cursor.idx === 0")
    # Drag to zoom: every chart shows the same narrower step range; the reset button brings all back.
    page.mouse.move(over["x"] + over["width"] * 0.3, over["y"] + over["height"] / 2)
    page.mouse.down()
    page.mouse.move(over["x"] + over["width"] * 0.7, over["y"] + over["height"] / 2, steps=5)
    page.mouse.up()
    ranges = page.evaluate("() => Object.values(window.runLive.charts).map(c => [c.u.scales.x.min, c.u.scales.x.max])")
    assert len({tuple(r) for r in ranges}) == 1 and ranges[0][1] - ranges[0][0] < steps - 1, ranges
    page.click("#reset-zoom")
    assert page.evaluate("() => window.runLive.charts.reward.u.scales.x.max - window.runLive.charts.reward.u.scales.x.min") >= steps - 1
    # Per-agent toggle: hiding "tool" hides its series in every chart.
    page.click("#agent-toggles button[data-agent=tool]")
    hidden = page.evaluate("""() => Object.values(window.runLive.charts)
        .flatMap(c => c.series.map((s, i) => [s.agent, c.u.series[i + 1].show])).filter(([a]) => a === 'tool')""")
    assert hidden and all(show is False for _, show in hidden)


def test_it_recovers_every_step_after_the_server_restarts(held_stack: Processes, alice: Member, held_world: TinyWorld,
                                                          browser_page: Any, shots: Path):
    page, stack = browser_page, held_stack
    steps = 6
    log_in(page, stack, alice)
    run_id = launch(page, stack, held_world, steps=steps, eval_every=0)
    try:
        page.wait_for_function("() => window.runLive.steps('reward/total').length >= 1", timeout=180_000)
        assert live_state(page)["steps"] == [1]  # the run holds at the start of step 2

        stack.kill_web()  # the socket drops abnormally; the run goes on in the worker
        page.wait_for_selector("#run-live[data-conn=reconnecting]", state="attached", timeout=60_000)
        stack.open_gate()  # type: ignore[attr-defined]
        # Steps the page cannot hear about: they go to the database only.
        wait_for(lambda: MetricPoint.objects.filter(run_id=run_id, step__gt=1).count() >= 2, "two steps while the server is down", 300)
        page.screenshot(path=str(shots / "run-live-disconnected.png"), full_page=True)
        stack.start_web()

        wait_for_socket(page, 120)
        wait_for_status(page, "succeeded", 300)
        wait_for_the_end(page, run_id, steps)
    except Exception:
        page.screenshot(path=str(shots / "run-live-reconnect-failure.png"), full_page=True)
        print(stack.logs())
        raise
    page.screenshot(path=str(shots / "run-live-after-reconnect.png"), full_page=True)

    end = live_state(page)
    assert end["reconnects"] >= 1
    assert end["steps"] == list(range(1, steps + 1))  # no step missing, none doubled
    for key in ("reward/team", "success", "step_time"):
        assert page.evaluate(f"() => window.runLive.steps('{key}')") == list(range(1, steps + 1))
    for agent in ("tool", "reasoner"):
        assert page.evaluate(f"() => window.runLive.steps('reward/total', '{agent}')") == list(range(1, steps + 1)), agent
    # ... and the charts show them: the reward chart's data has every step for every series.
    drawn = page.evaluate("() => window.runLive.charts.reward.u.data")
    assert drawn[0] == list(range(1, steps + 1)) and all(None not in column for column in drawn[1:]), drawn
    run = Run.objects.get(pk=run_id)
    assert sorted(end["episodes"]) == sorted(Rollout.objects.filter(run=run).values_list("id", flat=True))
    assert end["logIds"] == list(LogLine.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    assert end["badge"] == "Succeeded" and end["progress"] == f"{steps}/{steps}"
