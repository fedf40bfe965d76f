"""Sending work to the Celery workers by task name, and the one declaration of that work.

Services enqueue through here instead of importing their task modules, whose tasks import those
services back: the names below are the contract between the two (each task is declared with
`@shared_task(name=...)` in `webapp/runs/tasks.py` and `webapp/jobs/tasks.py`).

`JOB_KINDS` is the one list of job kinds. `Job.Kind` (the database's choices), the kind -> task
dispatch (`job_task`) and settings' `CELERY_TASK_ROUTES` (`task_routes`) are all read from it, so
a kind added here has its choice, its task name and its queue at once
(tests/webapp/jobs/test_job_kinds.py fails when a task is not registered or not routed).
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import current_app

from training.plan import queue_for

RUN_EXECUTE = "webapp.tasks.run_execute"
EVALUATION_EXECUTE = "webapp.tasks.evaluation_execute"
MERGE_EXECUTE = "webapp.tasks.merge_execute"
PLAYGROUND_EXECUTE = "webapp.tasks.playground_execute"

GPU_QUEUE = queue_for(hosts=1, gpus=1)
"""Where every task goes unless its sender names a queue (`gpu`): runs and jobs load models, so they
run on the GPU workers (`celery -A webapp worker -Q gpu`). A run's own message names the queue of
its GPU count and hosts (`Run.queue_name`)."""


@dataclass(frozen=True)
class JobKind:
    """One kind of job: work a GPU worker does besides training (`webapp.jobs.services`)."""

    value: str
    """What `Job.kind` holds."""
    label: str
    """How pages name it."""
    task: str
    """The Celery task that executes it."""


JOB_KINDS = (
    JobKind("evaluate", "Evaluation", EVALUATION_EXECUTE),
    JobKind("merge", "Merged export", MERGE_EXECUTE),
    JobKind("playground", "Playground", PLAYGROUND_EXECUTE),
)
"""Every job kind, in the order pages list them."""

TASKS = (RUN_EXECUTE, *(kind.task for kind in JOB_KINDS))
"""Every task a service sends."""


def task_routes() -> dict[str, dict[str, str]]:
    """settings' CELERY_TASK_ROUTES: every task on the GPU queue."""
    return {task: {"queue": GPU_QUEUE} for task in TASKS}


INTERACTIVE_PRIORITY = 0
TRAINING_PRIORITY = 9
"""The two lanes of a worker's queue. A job (a playground session, an evaluation, an ablation, a
merge) is short and someone waits for it; a run may take hours. Both go to the same queue, so every
worker that takes runs takes jobs too (`-Q gpu`), but a run's message is sent with the training
priority and a job's with the interactive one: the broker's Redis transport keeps one list per
priority and a worker pops them in order, 0 first (kombu's `priority_steps`), so a free worker
takes every waiting job before the next run, however many runs were queued earlier. A worker
busy with a run finishes it first (one task at a time, prefetch 1)."""


def task_priority(task: str) -> int:
    """The lane of `task`: training for runs, interactive for every job kind."""
    return TRAINING_PRIORITY if task == RUN_EXECUTE else INTERACTIVE_PRIORITY


def job_task(kind: str) -> str:
    """The task that executes a job of `kind` (a `Job.kind` value)."""
    return next(k.task for k in JOB_KINDS if k.value == kind)


def enqueue(task: str, *, object_id: int, task_id: str | None = None, queue: str | None = None) -> None:
    """Send one message for `task` about the run or job `object_id`, without retrying: a broker
    that is down raises kombu's `OperationalError` at once, and the caller leaves the row queued. The
    message goes in its task's lane (`task_priority`)."""
    current_app.send_task(task, args=[object_id], task_id=task_id, queue=queue, retry=False, priority=task_priority(task))
