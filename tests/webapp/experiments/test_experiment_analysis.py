"""The experiment page beyond its table: each arm's ablations as rows under it (mean ± interval
over the seeds ablated), learning curves per arm with a band over seeds, the "differences only"
config diff between two arms, and polling that goes on while an ablation runs and stops after."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.webapp.experiments.helpers import finish, launch, trials
from webapp.models import Job, MetricPoint


def ablated(run, key: str, label: str, team_success: float, *, status: str = "succeeded") -> Job:
    """An ablation job of `run` as the worker records it (`webapp.jobs.ablations`)."""
    result = {"evaluations": [{"step": 2, "temperature": 0.0, "n": 8, "team": {"success": team_success},
                               "agents": {"tool": {"success": team_success, "reward": 0.0}},
                               "ablation": {"kind": key, "agent": None, "key": key, "label": label}}]}
    return Job.objects.create(team=run.team, kind="evaluate", run=run, status=status,
                              params={"ablation": key, "ablation_label": label, "checkpoint_step": 2},
                              result=result if status == "succeeded" else {})


def test_each_arms_ablations_are_rows_with_mean_and_interval_over_seeds(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)  # lr 1e-4: seeds 0, 1; lr 1e-3: seeds 0, 1
    for run in runs:
        finish(run, 0.5)
    ablated(runs[0], "role_swap", "role swap", 0.2)
    ablated(runs[1], "role_swap", "role swap", 0.4)
    ablated(runs[2], "untrained", "untrained team", 0.1)
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    rows = page.split('<tr class="ablation-row"')
    assert len(rows) == 3
    # role swap of lr 1e-4: 0.2 and 0.4 -> mean 0.3, s = 0.1414, t(1) 12.706 -> 12.706 * 0.1414 / sqrt(2) = 1.271
    assert 'data-ablation="role_swap">' in rows[1] and "↳ role swap" in rows[1] and "0.300 ± 1.271" in rows[1]
    assert f'href="{runs[1].get_absolute_url()}#held-out">0.400</a>' in rows[1]
    assert "↳ untrained team" in rows[2] and "<td>0.100</td>" in rows[2]  # one seed: no interval
    assert rows[1].index("role swap") < page.index("optim.lr=0.001") < page.index("untrained team")


def test_the_page_polls_while_an_ablation_runs_and_stops_after(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    for run in trials(experiment):
        finish(run, 0.5)
    job = ablated(trials(experiment)[0], "role_swap", "role swap", 0.0, status="running")
    partial = alice.client.get(experiment.get_absolute_url(), headers={"HX-Request": "true"}).content.decode()
    assert 'hx-trigger="every 3s"' in partial
    Job.objects.filter(pk=job.pk).update(status="succeeded", result=ablated(trials(experiment)[0], "role_swap", "role swap", 0.25).result)
    partial = alice.client.get(experiment.get_absolute_url(), headers={"HX-Request": "true"}).content.decode()
    assert "every 3s" not in partial and "↳ role swap" in partial


@pytest.mark.parametrize("metric", ["reward/total", "held-out team.success"])
def test_the_learning_curves_are_each_arms_mean_and_band_over_seeds(alice, alice_world, metric):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    from django.utils import timezone

    for run, values in zip(runs, ([0.1, 0.3], [0.3, 0.5], [0.6, 0.8], [0.6, 0.8])):
        finish(run, values[1])
        for step, v in enumerate(values, start=1):
            MetricPoint.objects.create(run=run, step=step, values={"reward/total": v}, agents={}, time=timezone.now())
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="curves-card"' in page and "experiment-curves.js" in page and "charts.js" in page
    assert '<option value="held-out team.success">' in page and '<option value="reward/total">' in page
    data = alice.client.get(reverse("experiment_curves", args=[experiment.pk]), {"metric": metric}).json()
    first, second = data["arms"]
    assert first["label"] == "optim.lr=0.0001" and first["runs"] == 2
    if metric == "reward/total":
        assert first["steps"] == [1, 2] and first["mean"] == pytest.approx([0.2, 0.4])
        # two seeds, s = 0.1414: half width 12.706 * 0.1414 / sqrt(2) = 1.2706
        assert first["high"][0] == pytest.approx(0.2 + 1.2706, abs=1e-3) and first["low"][0] == pytest.approx(0.2 - 1.2706, abs=1e-3)
        assert second["mean"] == pytest.approx([0.6, 0.8]) and second["low"] == pytest.approx(second["high"])  # no spread
        assert "range" not in data  # a reward has no fixed axis
    else:  # finish() records held-out evaluations at steps 0 and 2
        assert first["steps"] == [0, 2] and first["mean"] == pytest.approx([0.0, 0.4])
        assert data["range"] == [0, 1]  # a 0-1 share: the chart's axis runs 0-1, not to 100
    bad = alice.client.get(reverse("experiment_curves", args=[experiment.pk]), {"metric": "<script>"})
    assert bad.status_code == 400


def test_the_config_diff_between_two_arms_shows_only_what_differs(alice, alice_world):
    experiment = launch(alice, alice_world, axes={"optim.lr": [1e-4, 1e-3], "grpo.k": [4]}, seeds=[0, 1])
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="arm-diff-card"' in page and '<option value="1" selected>optim.lr=0.001, grpo.k=4</option>' in page
    html = alice.client.get(reverse("experiment_diff", args=[experiment.pk]), {"a": "0", "b": "1"},
                            headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<div id="arm-diff">')
    keys = [chunk.split("</code>")[0] for chunk in html.split('<tr class="differs"><td><code>')[1:]]
    assert keys == ["optim.lr"] and "<td>0.0001</td><td>0.001</td>" in html
    same = alice.client.get(reverse("experiment_diff", args=[experiment.pk]), {"a": "0", "b": "0"}).content.decode()
    assert "Their configs are the same" in same
    assert "Pick two" in alice.client.get(reverse("experiment_diff", args=[experiment.pk]), {"a": "0", "b": "9"}).content.decode()


def test_one_button_ablates_every_finished_trial_and_says_what_it_refused(alice, alice_world, jobs_sent):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    for run in runs[:3]:
        finish(run, 0.5)  # the fourth trial is still queued
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="ablate-card"' in page and '<option value="alone:reasoner">reasoner alone</option>' in page
    response = alice.client.post(reverse("experiment_ablate", args=[experiment.pk]), {"ablation": "untrained"}, follow=True)
    assert "Ablation queued for 3 finished trials" in response.content.decode()
    assert sorted(Job.objects.filter(params__ablation="untrained").values_list("run_id", flat=True)) == sorted(r.pk for r in runs[:3])
    response = alice.client.post(reverse("experiment_ablate", args=[experiment.pk]), {"ablation": "role_swap"}, follow=True)
    assert f"Not ablated: trial 0 (run #{runs[0].pk}): role swap needs the run&#x27;s trained weights, and it saved no checkpoint." \
        in response.content.decode()


def test_the_api_gives_each_arms_ablations(alice, alice_world):
    from tests.webapp.api.test_api import Api
    from webapp.teams import services as tokens

    experiment = launch(alice, alice_world, seeds=[0])
    runs = trials(experiment)
    for run in runs:
        finish(run, 0.5)
    ablated(runs[0], "role_swap", "role swap", 0.25)
    api = Api(tokens.api_token_create(user=alice.user, team=alice.team, name="notebook")[1])
    arms = api.get(f"/api/v1/experiments/{experiment.pk}/").json()["arms"]
    assert arms[0]["ablations"] == [{"ablation": "role_swap", "label": "role swap",
                                     "metrics": {**{n: None for n in arms[0]["metrics"]},
                                                 "team.success": {"mean": 0.25, "ci95": None, "n": 1},
                                                 "tool.success": {"mean": 0.25, "ci95": None, "n": 1},
                                                 "tool.reward": {"mean": 0.0, "ci95": None, "n": 1}},
                                     "seeds": [{"seed": 0, "run": runs[0].pk, "value": 0.25}]}]
    assert arms[1]["ablations"] == []
