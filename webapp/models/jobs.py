"""Work for a GPU worker besides training (evaluate, merge, playground)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.core.enqueue import JOB_KINDS
from webapp.models.catalog import Dataset, Topology
from webapp.models.runs import Checkpoint, PlayedEpisode, Run
from webapp.models.teams import Team


class Job(models.Model):
    """Work a user asks of a GPU worker besides training: evaluate a checkpoint on a dataset, merge a
    LoRA adapter into its base for export, or play one task in the playground. The row is the
    job's state (claimed atomically like a run); `result` grows while it runs (playground turns)."""

    # EVALUATE, MERGE, PLAYGROUND: the kinds are declared once, with their tasks, in `webapp.core.enqueue.JOB_KINDS`.
    Kind = models.TextChoices("Kind", [(kind.value.upper(), (kind.value, kind.label)) for kind in JOB_KINDS])

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"

    ACTIVE = (Status.QUEUED, Status.RUNNING)

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="jobs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")
    kind = models.CharField(max_length=12, choices=Kind.choices)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, null=True, blank=True, related_name="jobs")
    checkpoint = models.ForeignKey(Checkpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs",
                                   help_text="Empty: the base models.")
    dataset = models.ForeignKey(Dataset, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")
    topology = models.ForeignKey(Topology, on_delete=models.SET_NULL, null=True, blank=True, related_name="jobs")
    params = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    output = models.CharField(max_length=500, blank=True, help_text="A folder the job wrote (merged model).")
    error = models.TextField(blank=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="Celery node name of the worker that took the job.")
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["run", "kind", "-created"], name="job_run_kind_created"),
            models.Index(fields=["team", "kind", "-created"], name="job_team_kind_created"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} #{self.pk}"

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE


class JobEpisode(PlayedEpisode):
    """One held-out task as an evaluation job (a checkpoint on a dataset, an ablation) played it:
    the run page's evaluation jobs link them, as its held-out table links its own evaluations'."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="episodes")
    evaluation = models.PositiveSmallIntegerField(default=0, help_text="Which of the job's evaluations (its result's list) played it.")
    episode = models.PositiveIntegerField(help_text="Index of the task within the evaluation.")

    class Meta:
        ordering = ["job", "evaluation", "episode"]

    def __str__(self) -> str:
        return f"job {self.job_id} episode {self.episode}"

    @property
    def step(self) -> int:
        """The checkpoint's step (0: the base models, or the warm start a run begins from), which
        the episode viewer shows."""
        return int(self.job.params.get("checkpoint_step") or 0)
