"""Celery tasks: thin shims that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from webapp import jobs, services
from webapp.models import Run


@shared_task(name="webapp.tasks.run_execute", bind=True, acks_late=True, ignore_result=True)
def run_execute(self, run_id: int) -> None:  # type: ignore[no-untyped-def]
    """Execute the first queued run in queue order (see `webapp.lifecycle`): `run_id` is the run
    whose creation sent this message, which is usually, but not always, the one it executes
    (the queue may have been reordered, or the run cancelled). No retries: the service records
    every engine failure on the run, and a redelivered message finds the run already claimed.
    The message stands for a run of `run_id`'s GPU count: only runs of that count are taken, so
    a message on the `gpu-x2` queue never starts a one-GPU run (whose own message is elsewhere)."""
    gpus = Run.objects.filter(pk=run_id).values_list("gpus", flat=True).first() or 1
    services.run_execute(worker=self.request.hostname or "", gpus=gpus)


# -- jobs (webapp/jobs.py): the row is claimed first, failures are recorded on it; no retries ----------


@shared_task(name="webapp.tasks.evaluation_execute", bind=True, acks_late=True, ignore_result=True)
def evaluation_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    jobs.evaluation_execute(job_id=job_id, worker=self.request.hostname or "")


@shared_task(name="webapp.tasks.merge_execute", bind=True, acks_late=True, ignore_result=True)
def merge_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    jobs.merge_execute(job_id=job_id, worker=self.request.hostname or "")


@shared_task(name="webapp.tasks.playground_execute", bind=True, acks_late=True, ignore_result=True)
def playground_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    jobs.playground_execute(job_id=job_id, worker=self.request.hostname or "")
