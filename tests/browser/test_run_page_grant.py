"""A run on several hosts is granted its Ray nodes while its page is open: the engine sends `placed`
(the nodes) and then the `starting` phase, and the page reads its summary card once for the two,
not once each. The page's socket is Playwright's (`route_web_socket`), so the test says what the
engine says and when; the page's clock is Playwright's too (`page.clock`), so "no second read"
is checked by running the page's timers past the 2 s in which it would have come, not by waiting."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.browser.conftest import Member, TinyWorld
from tests.browser.test_run_live import log_in
from tests.processes import Processes
from webapp.models import Run
from webapp.runs import services as run_services

pytestmark = pytest.mark.django_db(transaction=True)

COUNT_READS = """() => {
  // Every summary read goes through htmx.ajax (static/js/run-live.js, refreshSummary).
  window.summaryReads = [];
  const ajax = htmx.ajax;
  htmx.ajax = function (verb, url, options) { window.summaryReads.push(url); return ajax.apply(this, arguments); };
}"""


def test_a_grant_reads_the_summary_once(web: Processes, alice: Member, tiny_world: TinyWorld, browser_page: Any, settings: Any) -> None:
    settings.TROUPE_RAY_ADDRESS = "head:6379"  # a config of two hosts builds where a Ray cluster is named
    config = run_services.run_config_build(topology=tiny_world.topology, dataset=tiny_world.dataset, name="two hosts",
                                           overrides={"resources.hosts": 2, "optim.tasks_per_step": 2})
    run = Run.objects.create(team=tiny_world.team, owner=alice.user, name="two hosts", topology=tiny_world.topology,
                             dataset=tiny_world.dataset, config_yaml=config.to_yaml(), status=Run.Status.RUNNING, hosts=2,
                             environment="math_tool", specialization="lora")
    sockets: list[Any] = []

    def engine(ws: Any) -> None:  # no server behind it: the test speaks for the engine
        ws.on_message(lambda message: ws.send(json.dumps({"t": "pong"})) if '"ping"' in str(message) else None)
        sockets.append(ws)

    page = browser_page
    log_in(page, web, alice)
    page.clock.install()
    page.route_web_socket(re.compile(r".*/ws/runs/.*"), engine)
    page.goto(web.url + run.get_absolute_url())
    page.wait_for_function("() => window.runLive && window.runLive.state.conn === 'live'")
    page.evaluate(COUNT_READS)

    def say(message: dict[str, Any]) -> None:
        sockets[-1].send(json.dumps(message))
        page.clock.run_for(3000)  # past the page's 2 s between two summary reads

    say({"t": "placed"})
    assert page.evaluate("window.summaryReads.length") == 1, "the grant reads the summary's Hosts line"
    say({"t": "phase", "phase": "starting", "detail": "Starting 2 ranks on 2 Ray nodes", "progress": None})
    assert page.evaluate("window.summaryReads.length") == 1, "the starting phase of the same grant reads nothing more"
    assert page.locator("#run-phase .phase-detail").text_content() == "Starting 2 ranks on 2 Ray nodes"

    # A page that did not hear the grant (its socket opened after it) reads the summary when the
    # ranks start: the same run, a fresh page.
    page.goto(web.url + run.get_absolute_url())
    page.wait_for_function("() => window.runLive && window.runLive.state.conn === 'live'")
    page.evaluate(COUNT_READS)
    say({"t": "phase", "phase": "starting", "detail": "Starting 2 ranks on 2 Ray nodes", "progress": None})
    assert page.evaluate("window.summaryReads.length") == 1
