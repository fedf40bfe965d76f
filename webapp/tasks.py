"""Celery tasks: thin shims that take ids and call one service."""

from __future__ import annotations

from celery import shared_task

from webapp import services


@shared_task(name="webapp.tasks.run_execute", bind=True, acks_late=True, ignore_result=True)
def run_execute(self, run_id: int) -> None:  # type: ignore[no-untyped-def]
    """Execute a queued run. No retries: the service records every engine failure on the run,
    and a redelivered message finds the run already claimed and does nothing."""
    services.run_execute(run_id=run_id, worker=self.request.hostname or "")
