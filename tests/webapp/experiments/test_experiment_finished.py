"""A finished experiment says so (issue 46, class 1): no Cancel and no "Resume unfinished" once every
trial succeeded, and the services refuse both with a clear message; the list is newest first."""

from __future__ import annotations

from django.urls import reverse

from tests.webapp.experiments.helpers import finish, launch, trials
from webapp.models import Experiment


def test_a_finished_experiment_offers_neither_cancel_nor_resume(alice, alice_world):
    experiment = launch(alice, alice_world, seeds=[0])
    runs = trials(experiment)
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="experiment-cancel"' in page and 'id="experiment-resume"' not in page  # trials queued

    finish(runs[0], 0.5)
    finish(runs[1], 0.0, status="failed")
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="experiment-cancel"' not in page and "Resume 1 unfinished trial<" in page

    finish(runs[1], 0.25)
    page = alice.client.get(experiment.get_absolute_url()).content.decode()
    assert 'id="experiment-cancel"' not in page and 'id="experiment-resume"' not in page
    response = alice.client.post(reverse("experiment_resume", args=[experiment.pk]), follow=True).content.decode()
    assert f"Experiment #{experiment.pk} has no unfinished trial: every trial succeeded." in response
    assert "Started 0" not in response
    response = alice.client.post(reverse("experiment_cancel", args=[experiment.pk]), follow=True).content.decode()
    assert f"Experiment #{experiment.pk} has no queued or running trial to cancel" in response
    assert Experiment.objects.get(pk=experiment.pk).cancelled is None  # not marked cancelled after the fact
    assert experiment.runs.count() == 2


def test_the_list_is_newest_first(alice, alice_world):
    older = launch(alice, alice_world, seeds=[0], name="older")
    newer = launch(alice, alice_world, seeds=[0], name="newer")
    page = alice.client.get(reverse("experiment_list")).content.decode()
    assert page.index(f"#{newer.pk} newer") < page.index(f"#{older.pk} older")
