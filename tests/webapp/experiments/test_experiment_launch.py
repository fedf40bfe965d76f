"""Launching an experiment from the browser: the preview says how many runs and roughly how long;
the launch queues one ordinary run per arm and seed, each a trial of the experiment with the seed
as its run's seed; a bad spec shows every problem next to its field and saves nothing."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.experiments.helpers import finish
from webapp.models import Experiment, Run


def form(world, **extra):
    return {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "lr sweep",
            "advanced_yaml": "optim:\n  steps: 4\neval:\n  every: 2", "axes_yaml": "optim.lr: [1.0e-4, 3.0e-4]\ngrpo.k: [2, 4]",
            "seeds": "0, 1", "metric": "team.success", "direction": "maximize", **extra}


def test_it_previews_the_run_count_and_a_duration_from_the_teams_past_runs(alice, alice_world):
    page = alice.client.post(reverse("experiment_preview"), form(alice_world)).content.decode()
    assert "<strong>8 runs</strong>: 4 arms × 2 seeds, 32 training steps in all" in page
    assert "No finished run of your team to time yet" in page
    finish(alice_world.run, 0.5, step=4)  # 20 s for 4 steps: 5 s per step
    page = alice.client.post(reverse("experiment_preview"), form(alice_world)).content.decode()
    assert "Roughly 0:01:20 (h:mm:ss) at your team's recent 5.0 s per step, 2 trials at a time" in page  # 32 steps * 5 s / 2
    assert "optim.lr=0.0003, grpo.k=4" in page


def test_it_queues_one_run_per_arm_and_seed(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("experiment_new"), form(alice_world))
    experiment = Experiment.objects.get()
    assert response["Location"] == experiment.get_absolute_url()
    runs = list(experiment.runs.order_by("trial_index"))
    assert [r.trial_index for r in runs] == list(range(8)) and experiment.trial_count == 8
    configs = [r.to_config() for r in runs]
    assert [(c.optim.lr, c.grpo.k, c.seed) for c in configs[:3]] == [(1e-4, 2, 0), (1e-4, 2, 1), (1e-4, 4, 0)]
    assert all(c.optim.steps == 4 and c.eval.every == 2 for c in configs)
    assert {r.status for r in runs} == {"queued"} and sorted(enqueued) == sorted(r.pk for r in runs)
    assert runs[1].name == "lr sweep [optim.lr=0.0001, grpo.k=2] seed 1" and runs[0].topology == alice_world.topology
    assert experiment.to_spec().trials()[5].config == configs[5]


def test_it_shows_every_problem_next_to_its_field_and_saves_nothing(alice, alice_world):
    bad = form(alice_world, axes_yaml="optim.lr: [1.0e-4, 7]\noptim.nope: [1]\ngrpo.k: []", seeds="0, 0", metric="tool.accuracy")
    response = alice.client.post(reverse("experiment_new"), bad)
    page = response.content.decode()
    assert response.status_code == 200
    assert "axes.optim.lr: value 7 (item 2) is refused: must be between 0 and 1" in page
    assert "axes.optim.nope: unknown field &#x27;nope&#x27; in optim" in page
    assert "axes.grpo.k: must be a non-empty list of values" in page
    assert "seed 0 is listed twice" in page and "unknown metric &#x27;tool.accuracy&#x27;" in page
    assert not Experiment.objects.exists() and Run.objects.count() == 1  # the world's own run only


def test_it_refuses_ten_thousand_grid_points(alice, alice_world):
    axes = "grpo.k: [" + ", ".join(str(k) for k in range(2, 52)) + "]\noptim.lr: [" + ", ".join(f"{(i + 1) * 1e-5:.6f}" for i in range(50)) + "]\nlora.r: [1, 2, 4, 8]"
    page = alice.client.post(reverse("experiment_new"), form(alice_world, axes_yaml=axes, seeds="0")).content.decode()
    assert "10,000 grid points x 1 seeds = 10,000 runs; an experiment starts at most 256" in page
    assert not Experiment.objects.exists()


def test_an_axis_cannot_reach_outside_the_team(alice, alice_world, bob_world, tmp_path):
    outside = tmp_path / "elsewhere"
    page = alice.client.post(reverse("experiment_new"), form(
        alice_world, axes_yaml=f"model.source: ['local:{outside}']\ndata.path: [/etc/passwd]")).content.decode()
    assert "axes.model.source" in page and "data.path: cannot be an axis here" in page
    assert not Experiment.objects.exists()


def test_another_teams_topology_is_not_a_choice(alice, alice_world, bob_world):
    page = alice.client.post(reverse("experiment_new"), form(alice_world, topology=bob_world.topology.pk)).content.decode()
    assert "Select a valid choice" in page and not Experiment.objects.exists()
