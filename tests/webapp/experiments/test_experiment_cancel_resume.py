"""Cancel stops every queued and running trial of the experiment (and nothing else); resume starts
the trials that did not succeed: from their last checkpoint where they have one, else over."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.experiments.helpers import finish, launch, trials
from webapp.models import Checkpoint, Experiment, Run


def test_cancel_stops_queued_and_running_trials_only(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    finish(runs[0], 0.5)
    Run.objects.filter(pk=runs[1].pk).update(status="running")
    response = alice.client.post(reverse("experiment_cancel", args=[experiment.pk]), follow=True)
    assert b"Cancelled 3 queued or running trials." in response.content
    states = {r.pk: (r.status, r.cancel_requested) for r in Run.objects.filter(experiment=experiment)}
    assert states[runs[0].pk] == ("succeeded", False)
    assert states[runs[1].pk] == ("running", True)  # stops at its next step
    assert states[runs[2].pk][0] == states[runs[3].pk][0] == "cancelled"
    assert Run.objects.get(pk=alice_world.run.pk).status == "queued"  # not a trial: untouched
    experiment.refresh_from_db()
    assert experiment.cancelled is not None


def test_resume_restarts_unfinished_trials_from_their_checkpoints(alice, alice_world, enqueued, django_capture_on_commit_callbacks):
    experiment = launch(alice, alice_world, seeds=[0, 1])
    runs = trials(experiment)
    finish(runs[0], 0.5)
    finish(runs[1], 0.0, status="failed")
    Checkpoint.objects.create(run=runs[1], step=1, path="/tmp/ck/step-000001")
    alice.client.post(reverse("experiment_cancel", args=[experiment.pk]))
    with django_capture_on_commit_callbacks(execute=True):
        response = alice.client.post(reverse("experiment_resume", args=[experiment.pk]), follow=True)
    assert b"Started 3 unfinished trials again." in response.content
    new = Run.objects.filter(experiment=experiment, status="queued").order_by("trial_index")
    assert [r.trial_index for r in new] == [1, 2, 3]
    assert new[0].resumed_from_id == runs[1].pk and new[0].to_config().checkpoint.resume_from == "/tmp/ck/step-000001"
    assert new[1].resumed_from_id is None and new[1].to_config() == experiment.to_spec().trials()[2].config
    assert sorted(enqueued) == sorted(r.pk for r in new)
    experiment = Experiment.objects.get(pk=experiment.pk)
    assert experiment.cancelled is None and experiment.status == "active"
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert f'href="{new[0].get_absolute_url()}"' in page  # the trial's newest attempt


def test_resume_waits_for_active_trials(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    response = alice.client.post(reverse("experiment_resume", args=[experiment.pk]), follow=True)
    assert b"Some trials are still queued or running" in response.content
    assert experiment.runs.count() == 2
