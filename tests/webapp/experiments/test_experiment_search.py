"""A search from the browser: it queues its first trials up to the team's cap, each trial that ends
asks Optuna for the next (the study rebuilt from the runs), the pruner stops a trailing trial in
the worker, and the page shows the trials with their parameters and the best one."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.experiments.helpers import finish
from training.events import TrainResult
from webapp.models import Experiment, Run
from webapp.runs import services as run_services

SEARCH = "trials: 5\nparams:\n  optim.lr: {low: 1.0e-5, high: 1.0e-2, log: true}\nstartup_trials: 2"


def form(world, **extra):
    return {"topology": world.topology.pk, "dataset": world.dataset.pk, "name": "lr search",
            "advanced_yaml": "optim:\n  steps: 3\neval:\n  every: 1", "axes_yaml": "", "search_yaml": SEARCH,
            "seeds": "5", "metric": "team.success", "direction": "maximize", **extra}


def fake_train(quality):
    """Evaluates every step through the sink and stops when asked, as the trainer does."""
    def train(config, *, out_dir, sink):
        total, q = config.optim.steps, quality(config)
        sink.run_started(total_steps=total, start_step=0)
        evaluations = []
        for step in range(total + 1):
            if step and sink.should_stop():
                return TrainResult(status="cancelled", step=step - 1, evaluations=evaluations)
            result = {"step": step, "split": "eval", "temperature": 0.0, "n": 8, "team": {"success": q * step / total},
                      "agents": {"tool": {"success": q, "reward": 0.0}}}
            evaluations.append(result)
            sink.evaluation(result)
        return TrainResult(status="succeeded", step=total, evaluations=evaluations)
    return train


def test_a_search_queues_trials_as_they_end_and_the_pruner_stops_a_trailing_one(alice, alice_world, settings, enqueued,
                                                                                 django_capture_on_commit_callbacks):
    settings.TROUPE_EXPERIMENT_CONCURRENCY = 1
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded")
    page = alice.client.post(reverse("experiment_preview"), form(alice_world)).content.decode()
    assert "At most 5 runs</strong>: an Optuna search (TPE) of 5 trials at seed 5" in page
    with django_capture_on_commit_callbacks(execute=True):
        alice.client.post(reverse("experiment_new"), form(alice_world))
    experiment = Experiment.objects.get()
    first = experiment.runs.get()
    assert first.trial_index == 0 and first.to_config().seed == 5 and experiment.trial_count == 5
    assert 1e-5 <= first.to_config().optim.lr <= 1e-2

    order = iter([0.9, 0.8, 0.1, 0.85, 0.05])  # the third and fifth trials trail the completed ones from their first step
    good = fake_train(lambda c: next(order))
    with django_capture_on_commit_callbacks(execute=True):
        for _ in range(5):
            run_services.run_execute(worker="w", train=good)
    runs = list(experiment.runs.order_by("trial_index"))
    assert [r.trial_index for r in runs] == [0, 1, 2, 3, 4]  # each ended trial asked for the next, up to the budget
    assert len({r.to_config().optim.lr for r in runs}) == 5
    completed = [r for r in runs if r.status == "succeeded"]
    pruned = [r for r in runs if r.pruned_at_step is not None]
    assert [r.trial_index for r in pruned] == [2, 4] and [r.trial_index for r in completed] == [0, 1, 3]
    for run in pruned:  # stopped at its first trailing evaluation, not trained to the end
        assert run.status == "cancelled" and run.pruned_at_step == 1 and run.step < 3
        assert "pruned at step 1" in run.error_message

    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="search-trials"' in page and "Best trial: <strong>#" in page
    for run in pruned:
        assert f"pruned at step {run.pruned_at_step}" in page
    api_rows = [r for r in alice.client.get(reverse("experiment_export", args=[experiment.pk])).streaming_content]
    assert b"trial,optim.lr,run,state,team.success" in b"".join(api_rows)


def test_a_search_spec_shows_every_problem_at_its_field(alice, alice_world):
    bad = "trials: 0\nparams:\n  optim.lr: {low: 0, high: 1.0e-3, log: true}\n  grpo.k: {low: 2.5, high: 4}"
    page = alice.client.post(reverse("experiment_new"), form(alice_world, search_yaml=bad, axes_yaml="optim.lr: [1.0e-4]")).content.decode()
    assert "search.trials: must be a whole number of trials between 1 and 256" in page
    assert "search.params.optim.lr: a log-uniform range needs low above 0" in page
    assert "search.params.grpo.k: is a whole-number field" in page
    assert "a grid (axes) or a search, not both" in page
    assert not Experiment.objects.exists()


def test_a_cancelled_search_asks_no_more_and_resume_goes_on(alice, alice_world, settings, enqueued):
    settings.TROUPE_EXPERIMENT_CONCURRENCY = 2
    alice.client.post(reverse("experiment_new"), form(alice_world))
    experiment = Experiment.objects.get()
    assert experiment.runs.count() == 2
    alice.client.post(reverse("experiment_cancel", args=[experiment.pk]))
    run_services.experiment_trials_start(experiment=Experiment.objects.get(pk=experiment.pk))
    assert experiment.runs.count() == 2 and not experiment.runs.filter(status="queued").exists()
    for run in experiment.runs.all():
        finish(run, 0.5)
    alice.client.post(reverse("experiment_resume", args=[experiment.pk]))
    assert experiment.runs.count() == 4 and experiment.runs.filter(status="queued").count() == 2
