"""Sending work to the Celery workers by task name.

Services enqueue through here instead of importing their task modules, whose tasks import those
services back: the names below are the contract between the two (each task is declared with
`@shared_task(name=...)` in `webapp/runs/tasks.py` and `webapp/jobs/tasks.py`, and the routes in
settings' `CELERY_TASK_ROUTES` pick their queues by these names).
"""

from __future__ import annotations

from celery import current_app

RUN_EXECUTE = "webapp.tasks.run_execute"
EVALUATION_EXECUTE = "webapp.tasks.evaluation_execute"
MERGE_EXECUTE = "webapp.tasks.merge_execute"
PLAYGROUND_EXECUTE = "webapp.tasks.playground_execute"


def enqueue(task: str, *, object_id: int, task_id: str | None = None, queue: str | None = None) -> None:
    """Send one message for `task` about the run or job `object_id`, without retrying: a broker
    that is down raises kombu's `OperationalError` at once, and the caller leaves the row queued."""
    current_app.send_task(task, args=[object_id], task_id=task_id, queue=queue, retry=False)
