"""The Celery task that executes runs: a thin shim over `webapp.runs.services.run_execute`.
Its name is in `webapp.core.enqueue`.
"""

from __future__ import annotations

from celery import shared_task

from webapp.core import enqueue
from webapp.models import Run
from webapp.runs import services


@shared_task(name=enqueue.RUN_EXECUTE, bind=True, acks_late=True, ignore_result=True)
def run_execute(self, run_id: int) -> None:  # type: ignore[no-untyped-def]
    """Execute the first queued run in queue order (see `webapp.runs.queue`): `run_id` is the run
    whose creation sent this message, which is usually, but not always, the one it executes
    (the queue may have been reordered, or the run cancelled). No retries: the service records
    every engine failure on the run, and a redelivered message finds the run already claimed.
    The message stands for a run of `run_id`'s GPU count: only runs of that count are taken, so
    a message on the `gpu-x2` queue never starts a one-GPU run (whose own message is elsewhere),
    and a message on the `ray` queue starts only a run on several hosts."""
    gpus, hosts = Run.objects.filter(pk=run_id).values_list("gpus", "hosts").first() or (1, 1)
    services.run_execute(worker=self.request.hostname or "", gpus=gpus, hosts=hosts)
