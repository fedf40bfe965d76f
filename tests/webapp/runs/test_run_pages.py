"""Run list (shared history, paginated, filtered) and run page (status, metrics, evaluations,
error with traceback, config YAML, the live block)."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from tests.webapp.history_helpers import held_out_episode
from webapp.models import Evaluation, MetricPoint, Run


def test_it_paginates_the_team_history(alice, alice_world):
    for i in range(30):
        Run.objects.create(team=alice.team, name=f"sweep {i}", config_yaml=alice_world.run.config_yaml)
    page1 = alice.client.get(reverse("run_list"))
    assert page1.context["page"].paginator.count == 31 and len(page1.context["page"]) == 25
    page2 = alice.client.get(reverse("run_list"), {"page": 2})
    assert len(page2.context["page"]) == 6


def test_it_filters_by_status_and_search_and_returns_the_table_partial(alice, alice_world):
    Run.objects.create(team=alice.team, name="other", status="failed", config_yaml=alice_world.run.config_yaml)
    response = alice.client.get(reverse("run_list"), {"status": "failed"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="runs-table"') and "<html" not in html
    assert "other" in html and "first" not in html
    assert "first" in alice.client.get(reverse("run_list"), {"q": "firs"}).content.decode()


def test_it_shows_a_finished_run(alice, alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="succeeded", step=3, finished=timezone.now(), started=timezone.now())
    MetricPoint.objects.create(run=run, step=3, values={"reward/total": 0.123456, "success": 0.5},
                               agents={"tool": {"loss": 0.25}, "reasoner": {"loss": 0.5}}, time=timezone.now())
    Evaluation.objects.create(run=run, step=3, temperature=0.0, team_success=0.625, agents={"tool": {"success": 0.5, "reward": 0.1}},
                              data={"n": 8})
    html = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "Succeeded" in html and "3/3" in html
    assert "0.1235" in html and "reward/total" in html  # latest metrics
    assert "0.625" in html  # evaluations table
    table = " ".join(html.split('id="eval-table"')[1].split("</table>")[0].split())
    assert "<th>T</th>" not in table and ">Temperature</th>" in table and "<td>0 <span class=\"muted\">(greedy)</span></td>" in table
    assert "topology:" in html and "math_tool" in html  # config YAML
    assert 'id="run-summary"' in html and "every 3s" not in html  # finished runs do not poll


def test_it_streams_while_active_and_serves_the_summary_partial(alice, alice_world):
    url = reverse("run_detail", args=[alice_world.run.pk])
    html = alice.client.get(url).content.decode()
    assert f'data-ws="/ws/runs/{alice_world.run.pk}/"' in html and "run-live.js" in html  # the live page's socket
    partial = alice.client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<section id="run-summary"') and "<html" not in partial


def test_it_shows_the_error_and_traceback_of_a_failed_run(alice, alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status="failed", error_message="ModelLoadError: no such model",
                                                     traceback="Traceback (most recent call last):\n  boom")
    html = alice.client.get(reverse("run_detail", args=[alice_world.run.pk])).content.decode()
    assert "ModelLoadError: no such model" in html and "most recent call last" in html


def test_it_shows_active_and_recent_runs_on_the_dashboard(alice, alice_world):
    Run.objects.create(team=alice.team, name="done one", status="succeeded", config_yaml=alice_world.run.config_yaml,
                       final_metrics={"reward/total": 0.75})
    response = alice.client.get(reverse("dashboard"))
    assert list(response.context["active"]) == [alice_world.run]
    assert [r.name for r in response.context["recent"]] == ["done one"]
    assert b"0.75" in response.content


def test_each_evaluation_links_its_held_out_episodes_filtered_and_paged(alice, alice_world):
    """The worker's sink keeps every episode an evaluation played on its own rows (the evaluation's
    own row stays small); the run page's held-out table links them; the page filters by outcome
    and agent and shows them a page at a time."""
    from webapp.runs.rollouts import EVALUATION_PAGE
    from webapp.runs.sink import DatabaseSink

    run = alice_world.run
    n = EVALUATION_PAGE + 4

    DatabaseSink(run).evaluation({"step": 4, "temperature": 0.0, "n": n, "team": {"success": 0.25},
                                     "agents": {"tool": {"success": 0.5, "reward": 0.1}}, "episodes": [held_out_episode(i, solved_every=4) for i in range(n)]})
    evaluation = Evaluation.objects.get(run=run, step=4)
    assert evaluation.episodes.count() == n and "episodes" not in evaluation.data and evaluation.data["n"] == n
    url = reverse("run_evaluation", args=[run.pk, evaluation.pk])
    assert url in alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()

    first = alice.client.get(url)
    html = first.content.decode()
    assert first.status_code == 200 and html.count('class="episode ') == EVALUATION_PAGE and "page 1 of 2" in html
    assert "answer of task 0 by reasoner" in html and f"answer of task {EVALUATION_PAGE} by" not in html
    assert ">advantage</th>" not in html  # a training column: held-out episodes are not updated on
    second = alice.client.get(url, {"page": 2}).content.decode()
    assert second.count('class="episode ') == 4 and f"answer of task {n - 1} by tool" in second
    solved = alice.client.get(url, {"success": "yes"}).content.decode()
    assert solved.count('class="episode ') == n // 4 and "answer of task 1 by" not in solved
    tool = alice.client.get(url, {"agent": "tool", "success": "no"}).content.decode()
    assert tool.count('class="episode ') == n // 2 and "answer of task 2 by" not in tool  # odd tasks: the tool acted, none solved
    assert alice.client.get(url, {"page": "x"}).status_code == 200 and alice.client.get(url, {"page": "99"}).status_code == 200
    assert alice.client.get(reverse("run_evaluation", args=[run.pk, evaluation.pk + 1])).status_code == 404
