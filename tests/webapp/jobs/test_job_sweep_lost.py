"""Jobs (evaluation, merge, playground) whose worker died are failed, as runs are: by the sweep
once the worker's row goes silent or says it stopped, and by the worker's own restart."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from webapp.jobs import services as jobs
from webapp.models import Job, Worker
from webapp.ops import workers


def job(world, *, worker: str, status: str = Job.Status.RUNNING) -> Job:
    return Job.objects.create(team=world.run.team, kind=Job.Kind.EVALUATE, run=world.run, status=status, worker=worker,
                              started=timezone.now())


def test_a_job_whose_worker_went_silent_or_stopped_is_failed(alice_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 60
    now = timezone.now()
    Worker.objects.create(hostname="live@a", last_seen=now)
    Worker.objects.create(hostname="silent@a", last_seen=now - timedelta(seconds=61))
    Worker.objects.create(hostname="stopped@a", last_seen=now, stopped=now)
    live, silent, stopped = job(alice_world, worker="live@a"), job(alice_world, worker="silent@a"), job(alice_world, worker="stopped@a")
    unknown, unnamed = job(alice_world, worker="never-seen@a"), job(alice_world, worker="")
    done = job(alice_world, worker="silent@a", status=Job.Status.SUCCEEDED)
    assert sorted(jobs.job_sweep_lost()) == sorted([silent.pk, stopped.pk, unknown.pk])
    for j in (silent, stopped, unknown):
        j.refresh_from_db()
        assert j.status == Job.Status.FAILED and j.finished is not None and j.error.startswith("worker lost:")
    for j, status in ((live, "running"), (unnamed, "running"), (done, "succeeded")):
        j.refresh_from_db()
        assert j.status == status
    assert jobs.job_sweep_lost() == []  # never twice


def test_a_restarted_worker_fails_the_jobs_its_previous_process_left_running(alice_world):
    left = job(alice_world, worker="gpu0@a")
    other = job(alice_world, worker="gpu1@a")
    Worker.objects.create(hostname="gpu1@a", last_seen=timezone.now())
    workers.worker_started(hostname="gpu0@a", queues=["gpu"], pid=1)
    left.refresh_from_db()
    other.refresh_from_db()
    assert left.status == Job.Status.FAILED and "gpu0@a" in left.error
    assert other.status == Job.Status.RUNNING


def test_the_claim_records_the_worker(alice_world):
    queued = Job.objects.create(team=alice_world.run.team, kind=Job.Kind.MERGE, run=alice_world.run)
    jobs._claim(queued.pk, Job.Kind.MERGE, "gpu3@b")
    queued.refresh_from_db()
    assert queued.status == Job.Status.RUNNING and queued.worker == "gpu3@b"
