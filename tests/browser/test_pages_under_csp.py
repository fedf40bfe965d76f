"""A person going through every page in Chromium under the Content-Security-Policy (the
`browser_page` fixture fails the test on any violation Chromium reports): a stranger guessing a
password is locked out with a page that says so while alice logs in from the same address; the
dashboard, the lists, the new-run form's live preview, a run page's charts and "load older
episodes", compare, the playground, the team switcher and the admin all work.

Screenshots go to $TROUPE_SCREENSHOTS (or the test's tmp folder): csp-*.png."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings

from tests.browser.conftest import Member, TinyWorld
from tests.processes import Processes
from tests.webapp.history_helpers import add_evaluation_episodes, add_evaluations, add_metrics, add_rollouts, held_out_episode, make_run
from webapp.models import Job, JobEpisode, Membership, Run, Team
from webapp.runs import services as run_services

pytestmark = pytest.mark.django_db(transaction=True)




@pytest.fixture
def runs(tiny_world: TinyWorld, alice: Member) -> dict[str, Run]:
    config = run_services.run_config_build(topology=tiny_world.topology, dataset=tiny_world.dataset, name="t", overrides={"optim.steps": 30})
    like: Any = SimpleNamespace(config_yaml=config.to_yaml(), topology=tiny_world.topology, dataset=tiny_world.dataset)
    done = make_run(tiny_world.team, like, name="finished lora", owner=alice.user)
    add_metrics(done, 30)
    for point in done.metric_points.all():  # a run scored by two reward functions charts each
        point.values.update({"reward/fn/format_ok": min(1.0, 0.3 + point.step / 40), "reward/fn/short_answer": 0.5})
        point.save(update_fields=["values"])
    add_evaluations(done, [(0, 0.1, {"tool": 0.1, "reasoner": 0.05}), (30, 0.4, {"tool": 0.4, "reasoner": 0.2})])
    add_rollouts(done, 30)  # 60 episodes: more than one page, so "Load older episodes" shows
    add_evaluation_episodes(done.evaluations.get(step=30), 40)  # the last evaluation's tasks: two pages
    swap = Job.objects.create(team=tiny_world.team, owner=alice.user, kind="evaluate", run=done, status="succeeded",
                              params={"ablation": "role_swap", "ablation_label": "role swap", "checkpoint_step": 30},
                              result={"evaluations": [{"step": 30, "n": 6, "temperature": 0.0, "team": {"success": 0.5}, "agents": {}}]})
    JobEpisode.objects.bulk_create(JobEpisode.played(held_out_episode(i, solved_every=2), job=swap, episode=i) for i in range(6))
    other = make_run(tiny_world.team, like, name="finished lr 1e-3", owner=alice.user)
    add_metrics(other, 30, slope=0.02)
    running = make_run(tiny_world.team, like, name="halfway", owner=alice.user, status=Run.Status.RUNNING, step=12, total_steps=30)
    return {"done": done, "other": other, "running": running}


def shot(page: Any, shots: Path, name: str) -> None:
    page.screenshot(path=str(shots / f"csp-{name}.png"), full_page=True)


def test_it_works_page_by_page_under_the_policy(web: Processes, alice: Member, tiny_world: TinyWorld, runs: dict[str, Run],
                                                browser_page: Any, shots: Path):
    page = browser_page
    alice.user.is_staff = alice.user.is_superuser = True
    alice.user.save()
    Membership.objects.create(team=Team.objects.create(name="Bravo"), user=alice.user, role=Membership.Role.MEMBER)

    # A stranger guessing passwords is locked out, with a page that says so; alice, same address, is not.
    response = page.goto(web.url + "/login/")
    assert response is not None and "content-security-policy" in response.headers
    for _ in range(settings.AXES_FAILURE_LIMIT):
        page.fill("#id_username", "carol")
        page.fill("#id_password", "guess")
        page.click("button.primary")
        page.wait_for_load_state()
    assert page.locator(".locked-out").inner_text().startswith("Too many failed logins. Try again in 15 minutes")
    shot(page, shots, "login-locked-out")
    page.fill("#id_username", alice.user.username)
    page.fill("#id_password", alice.password)
    page.click("button.primary")
    page.wait_for_url(re.compile(r".*/$"))

    # Dashboard: the running run's progress bar is a <progress> at 40 %.
    assert page.locator("#dashboard-runs progress.bar").first.evaluate("p => p.value") == 40
    shot(page, shots, "dashboard")

    for path, name in (("/runs/", "runs"), ("/agents/", "agents"), ("/topologies/", "topologies"), ("/datasets/", "datasets"),
                       ("/models/", "models"), ("/workers/", "workers"), ("/storage/", "storage"), ("/account/tokens/", "tokens"), ("/team/members/", "members"), ("/team/audit/", "audit"), ("/account/password/", "password"), ("/no/such/page/", "not-found"),
                       (f"/topologies/{tiny_world.topology.pk}/", "topology-edit")):
        page.goto(web.url + path)
        assert page.evaluate("typeof window.htmx") == "object", path
        shot(page, shots, name)
    page.set_viewport_size({"width": 1280, "height": 800})  # a staff member in two teams has the fullest top bar
    page.goto(web.url + "/runs/")
    assert page.evaluate("document.querySelector('.topbar').scrollWidth") <= 1280
    assert page.locator(".account form button.linklike").is_visible() and page.locator(".account form button.linklike").bounding_box()["x"] < 1280
    page.set_viewport_size({"width": 1440, "height": 1000})

    # The new-run form's live preview (htmx POST on load and on change).
    page.goto(web.url + "/runs/new/")
    page.select_option("#id_topology", str(tiny_world.topology.pk))
    page.select_option("#id_dataset", str(tiny_world.dataset.pk))
    page.fill("#id_k", "6")
    page.locator("#id_k").dispatch_event("change")
    page.wait_for_selector("#preview pre.yaml:has-text('k: 6')")
    shot(page, shots, "run-new")

    # A finished run: charts from the socket's backlog (the nonced early socket), held-out chart, episodes.
    done = runs["done"]
    page.goto(web.url + f"/runs/{done.pk}/")
    page.wait_for_function("() => document.querySelectorAll('#charts figure.chart:not([hidden]) canvas').length >= 3")
    page.wait_for_selector("#eval-chart canvas")
    labels = page.locator("#chart-reward-fns .u-legend .u-series .u-label").all_inner_texts()
    assert labels == ["step", "format_ok", "short_answer"], labels
    page.locator("#chart-reward-fns").screenshot(path=str(shots / "csp-run-reward-fns.png"))
    # a value axis is as wide as its widest label as drawn, plus ticks and gap ("1.00" was cut to ".00")
    room = page.evaluate("""() => {
        const ctx = document.createElement("canvas").getContext("2d"), font = "bold 20px serif";
        ctx.font = font;
        const u = {ctx: ctx, axes: [{}, {font: [font, 20], ticks: {size: 10}, gap: 5}]};
        const size = window.troupeCharts.axisSize(u, ["0.00", "0.25", "1000.75"], 1, 1);
        return size - 15 - ctx.measureText("1000.75").width;
    }""")
    assert room >= 0, room
    page.wait_for_function("() => document.querySelectorAll('#episodes article.episode').length === 20")
    page.click("#episodes button.load-more")
    page.wait_for_function("() => document.querySelectorAll('#episodes article.episode').length === 40")
    ids = page.evaluate("() => Array.from(document.querySelectorAll('#episodes article.episode')).map(a => +a.dataset.id)")
    assert len(set(ids)) == 40 and ids == sorted(ids, reverse=True)  # the next 20 older ones, none twice
    shot(page, shots, "run")

    # The last evaluation's held-out episodes: linked from the held-out table, filtered in place (htmx, the URL kept).
    page.click("#eval-table a.eval-episodes >> nth=-1")
    page.wait_for_selector("#evaluation-count:has-text('episodes 1-32 of 40')")
    assert page.locator("#episodes article.episode").count() == 32
    page.select_option("#evaluation-filter select[name=success]", "no")
    page.wait_for_selector("#evaluation-count:has-text('of 26 matching')")
    assert page.locator("#episodes article.episode.ok").count() == 0 and "success=no" in page.url
    shot(page, shots, "evaluation-episodes")

    # An ablation job's episodes: linked from the run page's job table, filtered in place.
    page.goto(web.url + f"/runs/{done.pk}/")
    page.click("#eval-jobs a.job-episodes")
    page.wait_for_selector("#evaluation-count:has-text('episodes 1-6 of 6')")
    assert "step 30 on the run's held-out tasks · role swap" in page.locator("h1").inner_text()
    page.select_option("#evaluation-filter select[name=success]", "yes")
    page.wait_for_selector("#evaluation-count:has-text('of 3 matching')")
    shot(page, shots, "job-episodes")

    page.goto(web.url + f"/runs/compare/?ids={done.pk}&ids={runs['other'].pk}")
    page.wait_for_selector("#compare-chart-card canvas")
    shot(page, shots, "compare")

    page.goto(web.url + "/playground/")
    page.wait_for_selector("#playground-form")
    shot(page, shots, "playground")

    # The team switcher submits on change (static/js/troupe.js, no inline handler).
    page.goto(web.url + "/")
    with page.expect_navigation():
        page.select_option("select[name=team]", label="Bravo")
    assert page.locator("select[name=team] option:checked").inner_text() == "Bravo"
    page.select_option("select[name=team]", label=alice.team.name)
    page.wait_for_function(f"() => document.querySelector('select[name=team] option:checked').textContent === {alice.team.name!r}")

    # The admin: Django's own pages under the same policy.
    for path, name in (("/admin/", "admin"), ("/admin/webapp/run/", "admin-runs"), (f"/admin/webapp/run/{done.pk}/change/", "admin-run"),
                       ("/admin/auth/user/add/", "admin-user-add"),
                       ("/admin/webapp/auditevent/", "admin-audit"), ("/admin/axes/accessattempt/", "admin-axes")):
        response = page.goto(web.url + path)
        assert response is not None and response.status == 200, path
        shot(page, shots, name)
    assert "carol" in page.locator("#result_list").inner_text()  # the lockout, where an admin can lift it
