"""The experiment page: arms as rows with each metric's mean ± 95 % interval over the seeds whose
trial succeeded, each seed's value linking to its run, the best arm, live by htmx polling while
trials are active, the CSV export, and another team's experiment is a 404."""

from __future__ import annotations

import csv
import io

from django.urls import reverse

from tests.webapp.experiments.helpers import finish, launch, trials


def test_it_shows_arms_with_mean_and_interval_and_each_seeds_run(alice, alice_world):
    experiment = launch(alice, alice_world)
    runs = trials(experiment)  # lr 1e-4: seeds 0-2, then lr 1e-3: seeds 0-2
    for run, value in zip(runs, (0.2, 0.4, 0.6, 0.8, 0.9)):
        finish(run, value)
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    # lr 1e-4: mean 0.4, s = 0.2, t(2) = 4.303 -> half width 4.303 * 0.2 / sqrt(3) = 0.497
    assert "<td>optim.lr=0.0001</td>" in page and "0.400 ± 0.497" in page
    # lr 1e-3: two seeds done (t(1) = 12.706 * 0.0707 / sqrt(2) = 0.635), the third still queued
    assert "0.850 ± 0.635" in page
    assert f'href="{runs[4].get_absolute_url()}" title="run #{runs[4].pk}">0.900</a>' in page
    assert f'href="{runs[5].get_absolute_url()}" title="run #{runs[5].pk}">queued</a>' in page
    assert "Best arm: <strong>optim.lr=0.001</strong> — team.success 0.850 ± 0.635" in page
    assert "reasoner.success" in page and "tool.reward" in page
    assert 'hx-trigger="every 3s"' in page  # live while a trial is queued


def test_a_trial_evaluated_sampled_too_shows_its_sampled_metric_beside_the_greedy_one(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    for run, (greedy, sampled) in zip(trials(experiment), ((0.5, 0.25), (0.7, 0.35), (0.9, 0.45), (0.1, 0.05))):
        finish(run, greedy, sampled=sampled)
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert "sampled.team.success" in page and "0.300 ± " in page and "0.600 ± " in page  # sampled and greedy means of lr 1e-4
    response = alice.client.get(reverse("experiment_export", args=[experiment.pk]))
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    column = rows[0].index("sampled.team.success")
    assert [row[column] for row in rows[1:5]] == ["0.25", "0.35", "0.45", "0.05"]


def test_the_live_part_stops_polling_once_every_trial_has_ended(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    for run in trials(experiment):
        finish(run, 0.5)
    partial = alice.client.get(experiment.get_absolute_url(), headers={"HX-Request": "true"}).content.decode()
    assert partial.lstrip().startswith('<div id="experiment-results"') and "every 3s" not in partial
    assert "2 succeeded" in partial


def test_it_exports_every_trial_and_each_arms_interval_as_csv(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    for run, value in zip(runs, (0.25, 0.75, 0.5)):
        finish(run, value)
    response = alice.client.get(reverse("experiment_export", args=[experiment.pk]))
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows[0][:6] == ["trial", "arm", "optim.lr", "seed", "run", "status"] and rows[0][6] == "team.success"
    assert rows[1][:7] == ["0", "optim.lr=0.0001", "0.0001", "0", str(runs[0].pk), "succeeded", "0.25"]
    assert rows[4][5] == "queued" and rows[4][6] == ""
    summary = rows[rows.index([]) + 2]
    assert summary[:3] == ["optim.lr=0.0001", "2", "0.5"]
    assert float(summary[3]) < 0.5 < float(summary[4])


def test_another_teams_experiment_is_a_404(alice, alice_world, bob, bob_world):
    experiment = launch(bob, bob_world, seeds=[0])
    for name in ("experiment_detail", "experiment_export"):
        assert alice.client.get(reverse(name, args=[experiment.pk])).status_code == 404
    for name in ("experiment_cancel", "experiment_resume"):
        assert alice.client.post(reverse(name, args=[experiment.pk])).status_code == 404
    assert experiment.runs.filter(status="queued").count() == 2


def test_the_list_and_the_run_page_link_to_the_experiment(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    listing = alice.client.get(reverse("experiment_list")).content.decode()
    assert f'href="{experiment.get_absolute_url()}">#{experiment.pk} lr sweep</a>' in listing
    run_page = alice.client.get(trials(experiment)[1].get_absolute_url()).content.decode()
    assert f'href="{experiment.get_absolute_url()}">#{experiment.pk}</a> (trial 1)' in run_page


def test_a_spec_that_no_longer_validates_is_said_not_a_server_error(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    type(experiment).objects.filter(pk=experiment.pk).update(spec_yaml=experiment.spec_yaml.replace("lr: 0.0001", "lr: 7.0"))
    response = alice.client.get(experiment.get_absolute_url())
    assert response.status_code == 200 and "spec no longer validates" in response.content.decode()
