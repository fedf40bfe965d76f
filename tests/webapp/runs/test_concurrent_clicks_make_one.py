"""Writes that double clicks, two tabs or a script repeat at the same moment stay single: Resume of a
run, "Resume unfinished" of an experiment and an ablation request each check and insert under a
lock (the source row's; SQLite's write lock, which Troupe takes at BEGIN), so however many requests
arrive together, whichever wins, one run or job results. The requests are started together behind a
barrier, each in its own thread with its own database connection (run on SQLite and PostgreSQL)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connections
from django.test import Client
from django.urls import reverse

from tests.webapp.experiments.helpers import launch
from webapp.models import Checkpoint, Experiment, Job, Run

pytestmark = pytest.mark.django_db(transaction=True)

CLICKS = 6


def together(clients: list[Client], request: Callable[[Client], Any]) -> list[Any]:
    """`request(client)` for every client at once (threads released by one barrier); their answers."""
    barrier = threading.Barrier(len(clients))
    answers: list[Any] = []
    errors: list[BaseException] = []

    def click(client: Client) -> None:
        try:
            barrier.wait(timeout=60)
            answers.append(request(client))
        except BaseException as exc:  # noqa: BLE001 (reported below, in the test's thread)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(client,)) for client in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert len(answers) == len(clients)
    return answers


def clients_of(persona: Any, n: int = CLICKS) -> list[Client]:
    out = []
    for _ in range(n):
        client = Client()
        client.force_login(persona.user)
        out.append(client)
    return out


def test_resume_clicked_together_makes_one_run(alice, alice_world, enqueued):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.CANCELLED, step=2)
    Checkpoint.objects.create(run=run, step=2, path=f"/nowhere/{run.pk}/step-000002")
    answers = together(clients_of(alice), lambda c: c.post(reverse("run_resume", args=[run.pk])))
    resumes = list(Run.objects.filter(resumed_from=run))
    assert len(resumes) == 1, [r.pk for r in resumes]
    assert {a.status_code for a in answers} == {302} and {a["Location"] for a in answers} == {resumes[0].get_absolute_url()}
    assert enqueued == [resumes[0].pk]
    # once that resume has failed, the lineage goes on from it (from the checkpoint it started from,
    # `Run.resume_point`), never as a second fork of the original
    Run.objects.filter(pk=resumes[0].pk).update(status=Run.Status.FAILED)
    alice.client.post(reverse("run_resume", args=[run.pk]))
    assert Run.objects.filter(resumed_from=run).count() == 1
    alice.client.post(reverse("run_resume", args=[resumes[0].pk]))
    assert Run.objects.filter(resumed_from=resumes[0]).count() == 1


def test_resume_unfinished_clicked_together_queues_each_trial_once(alice, alice_world, enqueued):
    experiment = launch(alice, alice_world, axes={"optim.lr": [1e-4, 1e-3]}, seeds=[0])
    experiment.runs.update(status=Run.Status.CANCELLED)
    together(clients_of(alice), lambda c: c.post(reverse("experiment_resume", args=[experiment.pk])))
    experiment = Experiment.objects.get(pk=experiment.pk)
    queued = list(experiment.runs.filter(status=Run.Status.QUEUED).values_list("trial_index", flat=True))
    assert sorted(queued) == [0, 1]
    assert experiment.runs.count() == 4


def test_ablations_asked_together_make_one_job(alice, alice_world, jobs_sent):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED, environment="math_tool")
    answers = together(clients_of(alice, 8), lambda c: c.post(reverse("run_ablate", args=[run.pk]), {"ablation": "untrained"}))
    assert {a.status_code for a in answers} == {302}
    jobs = list(Job.objects.filter(run=run, params__ablation="untrained"))
    assert len(jobs) == 1 and jobs_sent == [("evaluation_execute", jobs[0].pk)]
