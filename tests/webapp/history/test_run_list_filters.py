"""The run list finds any past run of the team: filters (status, topology, dataset, environment,
specialization, owner, tag, date), search over names and notes, archived runs hidden by default,
sort by any final metric (runs without it last), filters kept across pages."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from tests.webapp.history_helpers import make_run
from webapp.history import selectors as history
from webapp.models import Dataset, Run, Tag, Topology


def names(response) -> list[str]:
    return [r.name for r in response.context["page"]]


def test_it_filters_by_every_column(alice, alice_world, bob):
    base = alice_world.run
    other_topology = Topology.objects.create(team=alice.team, name="solo", environment="arithmetic", specialization="single")
    other_dataset = Dataset.objects.create(team=alice.team, name="arith", kind="generator", environment="arithmetic", size=4, eval_size=2)
    make_run(alice.team, base, name="failed one", status=Run.Status.FAILED)
    make_run(alice.team, base, name="solo run", topology=other_topology, dataset=other_dataset, environment="arithmetic",
             specialization="single", owner=bob.user)
    old = make_run(alice.team, base, name="old run")
    Run.objects.filter(pk=old.pk).update(created=timezone.now() - timedelta(days=40))
    tagged = make_run(alice.team, base, name="tagged")
    tagged.tags.add(Tag.objects.create(team=alice.team, name="baseline"))
    url = reverse("run_list")
    get = alice.client.get

    assert names(get(url, {"status": "failed"})) == ["failed one"]
    assert names(get(url, {"topology": other_topology.pk})) == ["solo run"]
    assert names(get(url, {"dataset": other_dataset.pk})) == ["solo run"]
    assert names(get(url, {"environment": "arithmetic"})) == ["solo run"]
    assert names(get(url, {"specialization": "single"})) == ["solo run"]
    assert names(get(url, {"owner": bob.user.pk})) == ["solo run"]
    assert names(get(url, {"tag": "baseline"})) == ["tagged"]
    month_ago = (timezone.now() - timedelta(days=30)).date().isoformat()
    assert "old run" not in names(get(url, {"created_from": month_ago}))
    assert names(get(url, {"created_to": month_ago})) == ["old run"]
    assert get(url, {"status": "nonsense", "owner": "x", "created_from": "yesterday"}).status_code == 200  # bad values are ignored


def test_it_searches_names_and_notes(alice, alice_world):
    make_run(alice.team, alice_world.run, name="lr sweep 3", notes="Diverged after step 40: the KL blew up.")
    make_run(alice.team, alice_world.run, name="baseline")
    assert names(alice.client.get(reverse("run_list"), {"q": "SWEEP"})) == ["lr sweep 3"]
    assert names(alice.client.get(reverse("run_list"), {"q": "kl diverged"})) == ["lr sweep 3"]  # every word, anywhere


def test_it_hides_archived_runs_unless_asked(alice, alice_world):
    make_run(alice.team, alice_world.run, name="shelved", archived=True)
    url = reverse("run_list")
    assert "shelved" not in names(alice.client.get(url))
    assert "shelved" in names(alice.client.get(url, {"archived": "all"})) and "first" in names(alice.client.get(url, {"archived": "all"}))
    assert names(alice.client.get(url, {"archived": "only"})) == ["shelved"]


def test_it_sorts_by_a_final_metric_with_missing_values_last(alice, alice_world):
    for name, success in (("low", 0.1), ("high", 0.9), ("mid", 0.5)):
        make_run(alice.team, alice_world.run, name=name, final_metrics={"success": success, "reward/total": -success})
    url = reverse("run_list")
    assert names(alice.client.get(url, {"sort": "-metric:success"})) == ["high", "mid", "low", "first"]
    assert names(alice.client.get(url, {"sort": "metric:success"})) == ["low", "mid", "high", "first"]
    assert names(alice.client.get(url, {"sort": "-metric:reward/total"}))[:3] == ["low", "mid", "high"]
    html = alice.client.get(url).content.decode()
    assert 'value="-metric:success"' in html and 'value="-metric:reward/total"' in html  # offered in the sort menu


def test_it_keeps_filters_in_the_pager_and_serves_the_table_partial(alice, alice_world):
    for i in range(30):
        make_run(alice.team, alice_world.run, name=f"sweep {i}", status=Run.Status.FAILED)
    response = alice.client.get(reverse("run_list"), {"status": "failed", "sort": "name"}, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="runs-table"') and "<html" not in html
    assert "status=failed&amp;sort=name&amp;page=2" in html
    page2 = alice.client.get(reverse("run_list"), {"status": "failed", "sort": "name", "page": 2})
    assert len(page2.context["page"]) == 5 and all(n.startswith("sweep") for n in names(page2))


def test_it_never_shows_another_teams_runs(alice, alice_world, bob, bob_world):
    make_run(bob.team, bob_world.run, name="bravo secret", notes="secret")
    assert "bravo secret" not in alice.client.get(reverse("run_list"), {"q": "secret", "archived": "all"}).content.decode()
    assert names(alice.client.get(reverse("run_list"), {"topology": bob_world.topology.pk})) == []


def test_it_parses_filters_leniently():
    f = history.RunFilter.from_query({"sort": "metric:'; DROP TABLE", "archived": "maybe", "topology": "-1"})
    assert f.sort == "-created" and f.archived == "" and f.topology is None
    assert history.RunFilter.from_query({"sort": "-metric:reward/total"}).metric == "reward/total"


def test_it_sorts_running_runs_by_their_latest_step(alice, alice_world):
    """The sink keeps `final_metrics` at the latest step while a run trains, so sorting by a metric
    places running runs too."""
    import time as _time

    from training.events import StepMetrics
    from webapp.runs.sink import DatabaseSink

    running = make_run(alice.team, alice_world.run, name="still training", status=Run.Status.RUNNING)
    make_run(alice.team, alice_world.run, name="done", final_metrics={"success": 0.5})
    sink = DatabaseSink(running)
    sink.metrics(StepMetrics(step=1, total_steps=9, values={"success": 0.25}, agents={}, time=_time.time()))
    sink.metrics(StepMetrics(step=2, total_steps=9, values={"success": 0.75}, agents={}, time=_time.time()))
    assert names(alice.client.get(reverse("run_list"), {"sort": "-metric:success"}))[:2] == ["still training", "done"]


def test_it_offers_each_filter_value_once(alice, alice_world):
    for i in range(3):
        make_run(alice.team, alice_world.run, name=f"again {i}")
    make_run(alice.team, alice_world.run, name="solo", environment="arithmetic", specialization="single")
    choices = history.run_filter_choices(team=alice.team)
    assert choices.environments == ["arithmetic", "math_tool"] and choices.specializations == ["lora", "single"]
    page = alice.client.get(reverse("run_list")).content.decode()
    assert page.count('<option value="math_tool"') == 1 and page.count('<option value="lora"') == 1


def test_the_table_refreshes_itself_and_shows_a_run_launched_elsewhere(alice, alice_world):
    url = reverse("run_list")
    page = alice.client.get(url, {"status": "queued"}).content.decode()
    table = page.split('<div id="runs-table"')[1].split(">")[0]
    assert 'hx-trigger="every 3s"' in table and 'hx-get="/runs/?status=queued"' in table  # a queued run: soon
    assert f'id="pick-{alice_world.run.pk}" hx-preserve="true"' in page  # a ticked box survives the refresh
    elsewhere = make_run(alice.team, alice_world.run, name="from the API", status=Run.Status.QUEUED)
    refresh = alice.client.get(url, {"status": "queued"}, headers={"HX-Request": "true", "HX-Trigger": "runs-table"})
    assert "from the API" in refresh.content.decode() and "HX-Push-Url" not in refresh  # the address stays
    assert elsewhere.pk
    Run.objects.update(status="succeeded")
    idle = alice.client.get(url).content.decode().split('<div id="runs-table"')[1].split(">")[0]
    assert 'hx-trigger="every 10s"' in idle
    filtered = alice.client.get(url, {"q": "API"}, headers={"HX-Request": "true", "HX-Trigger": "run-filters"})
    assert filtered["HX-Push-Url"] == "/runs/?q=API"  # a filter change still moves the address
