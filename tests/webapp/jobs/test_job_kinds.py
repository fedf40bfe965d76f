"""A job kind is declared once, in `webapp.core.enqueue.JOB_KINDS`: the job row's choices, the task
each kind is sent to and that task's queue are read from there. A kind whose task no worker
registers, a task that is registered but not declared (so not routed), or a route to a queue the
shipped workers do not serve fails here: such a job would wait in a queue no worker takes."""

from __future__ import annotations

import pytest

from webapp.celery import app as celery_app
from webapp.core import enqueue
from webapp.jobs.services import AUDIT_VERBS, job_enqueue
from webapp.management.commands import troupe
from webapp.models import Job
from webapp.teams.audit import JOB_TYPES

KINDS = [pytest.param(kind, id=kind.value) for kind in enqueue.JOB_KINDS]


def test_the_job_row_offers_every_declared_kind():
    assert Job.Kind.choices == [(kind.value, kind.label) for kind in enqueue.JOB_KINDS]


def test_the_workers_register_exactly_the_tasks_the_services_send():
    celery_app.loader.import_default_modules()  # the workers' autodiscovery: webapp/runs/tasks.py, webapp/jobs/tasks.py
    assert {name for name in celery_app.tasks if name.startswith("webapp.")} == set(enqueue.TASKS)


@pytest.mark.parametrize("kind", KINDS)
def test_a_job_goes_to_its_task_on_a_queue_the_workers_serve(kind, monkeypatch):
    sent: list[tuple[str, str | None]] = []
    monkeypatch.setattr(enqueue.current_app, "send_task", lambda name, args, **kw: sent.append((name, kw.get("queue"))))
    job_enqueue(job=Job(pk=7, kind=kind.value, celery_task_id="t-7"))
    assert sent == [(kind.task, None)]  # no queue named: the route decides
    queue = celery_app.amqp.router.route({}, kind.task)["queue"].name
    assert queue == enqueue.GPU_QUEUE
    assert queue in troupe.LOCAL_QUEUES.split(",")  # `manage.py troupe`'s worker (docker/ and docs/deploy.md: `-Q gpu`)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_named_in_the_audit_trail(kind):
    assert Job.Kind(kind.value) in AUDIT_VERBS and Job.Kind(kind.value) in JOB_TYPES
