"""Celery tasks of the jobs: thin shims that take a job id and call one service. The row is
claimed first and failures are recorded on it; no retries. Names: `webapp.core.enqueue`.
"""

from __future__ import annotations

from celery import shared_task

from webapp.core import enqueue
from webapp.jobs import services


@shared_task(name=enqueue.EVALUATION_EXECUTE, bind=True, acks_late=True, ignore_result=True)
def evaluation_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    services.evaluation_execute(job_id=job_id, worker=self.request.hostname or "")


@shared_task(name=enqueue.MERGE_EXECUTE, bind=True, acks_late=True, ignore_result=True)
def merge_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    services.merge_execute(job_id=job_id, worker=self.request.hostname or "")


@shared_task(name=enqueue.PLAYGROUND_EXECUTE, bind=True, acks_late=True, ignore_result=True)
def playground_execute(self, job_id: int) -> None:  # type: ignore[no-untyped-def]
    services.playground_execute(job_id=job_id, worker=self.request.hostname or "")
