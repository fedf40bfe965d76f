"""Celery tasks: thin shims that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from webapp import jobs, services


@shared_task(name="webapp.tasks.run_execute", bind=True, acks_late=True, ignore_result=True)
def run_execute(self, run_id: int) -> None:  # type: ignore[no-untyped-def]
    """Execute the first queued run in queue order (see `webapp.lifecycle`): `run_id` is the run
    whose creation sent this message, which is usually, but not always, the one it executes
    (the queue may have been reordered, or the run cancelled). No retries: the service records
    every engine failure on the run, and a redelivered message finds the run already claimed."""
    services.run_execute(worker=self.request.hostname or "")


# -- jobs (webapp/jobs.py): the row is claimed first, failures are recorded on it; no retries ----------


@shared_task(name="webapp.tasks.evaluation_execute", acks_late=True, ignore_result=True)
def evaluation_execute(job_id: int) -> None:
    jobs.evaluation_execute(job_id=job_id)


@shared_task(name="webapp.tasks.merge_execute", acks_late=True, ignore_result=True)
def merge_execute(job_id: int) -> None:
    jobs.merge_execute(job_id=job_id)


@shared_task(name="webapp.tasks.playground_execute", acks_late=True, ignore_result=True)
def playground_execute(job_id: int) -> None:
    jobs.playground_execute(job_id=job_id)
