"""The Celery app. Workers: `celery -A webapp worker -Q gpu -P solo` (one run at a time).

Configuration lives in settings (`CELERY_*`, see STACK-NOTES): late acks, prefetch 1, a broker
visibility timeout above the longest run, the run task routed to the `gpu` queue. The worker
process never imports torch before a task starts, so no CUDA context exists before a fork.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["webapp"])


@worker_shutting_down.connect
def _stop_runs_on_shutdown(sig: str, how: str, exitcode: int, **kwargs: Any) -> None:
    """Ctrl-C / SIGTERM: ask the run in this process to stop at its next step, so the worker
    exits after recording it as cancelled. Runs inside a signal handler: only sets a flag."""
    from webapp.sink import WORKER_SHUTTING_DOWN

    WORKER_SHUTTING_DOWN.set()
