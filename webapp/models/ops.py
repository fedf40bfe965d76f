"""The GPU workers, as they report themselves."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.models.runs import Run


class Worker(models.Model):
    """A Celery worker process serving GPU queues (`gpu_queue`), as it last reported itself.

    Workers are shared by every team (they are not team objects). Each worker process writes its
    row every few seconds from a background thread (`webapp.ops.workers.WorkerBeat`); a worker is
    online while that heartbeat is fresh.
    """

    hostname = models.CharField(max_length=200, unique=True, help_text="Celery node name, e.g. gpu0@host-a.")
    pid = models.PositiveIntegerField(default=0)
    queues = models.CharField(max_length=200, blank=True)
    started = models.DateTimeField(default=timezone.now)
    last_seen = models.DateTimeField(default=timezone.now)
    stopped = models.DateTimeField(null=True, blank=True, help_text="Set when the worker shut down cleanly.")
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                            help_text="The run it is executing now.")
    rss_bytes = models.PositiveBigIntegerField(default=0, help_text="Resident memory of the worker process.")
    gpu = models.JSONField(default=dict, blank=True, help_text="GPU name and memory (bytes), when it uses one.")
    sandbox = models.JSONField(
        default=dict, blank=True,
        help_text="The sandbox layers this worker's host provides (agents.sandbox.capabilities); 'missing' names those it lacks.",
    )
    plugin_problems = models.JSONField(default=dict, blank=True, help_text="Registered plugins that failed to load in this worker.")

    class Meta:
        ordering = ["hostname"]

    def __str__(self) -> str:
        return self.hostname

    def queue_names(self) -> list[str]:
        """The queues it takes work from, as it reported them."""
        return [q for q in self.queues.split(",") if q]

    def is_online(self, now: Any = None) -> bool:
        """Heard from within the lost-worker timeout, and not shut down."""
        age = ((now or timezone.now()) - self.last_seen).total_seconds()
        return self.stopped is None and age < settings.TROUPE_WORKER_LOST_SECONDS
