"""A training run and what it records as it goes: metric points, rollouts, checkpoints,
evaluations and log lines."""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any, Self

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from training.config import RunConfig
from training.plan import queue_for
from webapp.core.values import storable
from webapp.models.catalog import Dataset, Topology
from webapp.models.teams import Team


def queue_clock() -> int:
    """Microseconds since the epoch: a new queued run's place (`Run.queue_order`), behind the others."""
    return time.time_ns() // 1000


def gpu_queue(gpus: int) -> str:
    """The Celery queue of runs that need `gpus` GPUs on one host (`training.plan.queue_for`): `gpu`
    for one, `gpu-x<N>` for N. A worker serves the queues of the GPU counts it has."""
    return queue_for(hosts=1, gpus=gpus)


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    ACTIVE = (Status.QUEUED, Status.RUNNING)
    QUEUE_ORDER = ("-priority", "queue_order", "id")
    """The order in which workers take queued runs (`webapp.runs.queue.run_claim_next`)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="runs")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="runs")
    name = models.CharField(max_length=200)
    topology = models.ForeignKey(Topology, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs")
    dataset = models.ForeignKey(Dataset, on_delete=models.SET_NULL, null=True, blank=True, related_name="runs")
    config_yaml = models.TextField(help_text="The RunConfig snapshot this run executes (re-runnable from the CLI).")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    final_metrics = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(default=timezone.now)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    error_message = models.TextField(blank=True)
    traceback = models.TextField(blank=True)
    resumed_from = models.ForeignKey("self", on_delete=models.SET_NULL, null=True, blank=True, related_name="resumes")
    resumed_at_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="The step of `resumed_from`'s checkpoint this run continues from.",
    )
    priority = models.SmallIntegerField(
        default=0, help_text="Queued runs with a higher priority start first (site staff set it in the admin).",
    )
    queue_order = models.BigIntegerField(
        default=queue_clock, help_text="Place among queued runs of the same priority, smaller first (up/down swap it).",
    )
    out_dir = models.CharField(max_length=500, blank=True)
    cancel_requested = models.BooleanField(default=False)
    celery_task_id = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True, help_text="Hostname of the Celery worker that ran it.")
    # The shared history (webapp/history/): searchable notes, tags, archive, and two config
    # facts copied out of the snapshot at creation so the list filters on indexed columns.
    notes = models.TextField(blank=True)
    tags = models.ManyToManyField("Tag", blank=True, related_name="runs")
    archived = models.BooleanField(default=False, help_text="Hidden from the run list unless asked for.")
    environment = models.CharField(max_length=200, blank=True, help_text="config.topology.environment")
    specialization = models.CharField(max_length=10, blank=True, help_text="config.topology.specialization")
    algorithm = models.CharField(max_length=10, default="grpo", help_text="config.algorithm: grpo (own rollouts) or sft (conversations).")
    gpus = models.PositiveSmallIntegerField(
        default=1, help_text="config.resources.gpus: the run waits on the queue of workers with that many GPUs (gpu, gpu-x2, ...).",
    )
    hosts = models.PositiveSmallIntegerField(
        default=1, help_text="config.resources.hosts: more than one, the run waits on the `ray` queue (a worker beside a Ray cluster).",
    )
    cluster = models.JSONField(
        default=dict, blank=True,
        help_text="Where a run on several hosts runs, once its Ray cluster granted it (training.events `placed`): hosts asked, "
                  "ranks, resource, Ray nodes -> ranks on each.",
    )
    plan = models.JSONField(
        default=dict, blank=True,
        help_text="How the run executes, as its worker resolved it at the start (training.events `plan`, training.plan.Plan): "
                  "launcher, ranks, parallel mode, device, generation backend, async sampler and why, queue.",
    )
    experiment = models.ForeignKey(
        "Experiment", on_delete=models.SET_NULL, null=True, blank=True, related_name="runs",
        help_text="The experiment this run is a trial of (its arm and seed: `trial_index` in the experiment's spec).",
    )
    trial_index = models.PositiveIntegerField(
        null=True, blank=True, help_text="Which of the experiment's trials (`ExperimentSpec.trials()`) this run is; a resumed trial keeps it.",
    )
    pruned_at_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="A search trial the experiment's pruner stopped: the evaluation step that trailed the median.",
    )
    # What the engine says it is doing now (`EventSink.status`), kept while the run runs.
    phase = models.CharField(max_length=20, blank=True, help_text="training.events.PHASES: loading, evaluating, training, ...")
    phase_detail = models.CharField(max_length=300, blank=True, help_text="The engine's sentence about it, e.g. 'Evaluating at step 10: 50/100 held-out tasks'.")
    phase_progress = models.FloatField(null=True, blank=True, help_text="Share of the phase done (0..1), when the engine knows.")
    eta = models.DateTimeField(null=True, blank=True, help_text="When the engine expects the run to finish (from its own step, evaluation and checkpoint times).")

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["team", "-created"], name="run_team_created"),
            models.Index(fields=["team", "status", "-created"], name="run_team_status_created"),
            models.Index(fields=["team", "archived", "-created"], name="run_team_archived_created"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("run_detail", args=[self.pk])

    @property
    def queue_name(self) -> str:
        return queue_for(hosts=self.hosts, gpus=self.gpus)

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def can_cancel(self) -> bool:
        return self.is_active and not self.cancel_requested

    @property
    def can_resume(self) -> bool:
        """Failed or cancelled, and not continued yet: a new run can continue from its resume point
        (`resume_point`, if it has one). Once a run has been resumed, its lineage goes on in the run
        that resumed it (`continued_by`), which is the one to resume if it stops in turn."""
        return self.status in (self.Status.FAILED, self.Status.CANCELLED) and self.continued_by is None

    @cached_property
    def continued_by(self) -> Run | None:
        """The newest run that resumes this one, whatever its state (None while no one resumed it)."""
        return self.resumes.order_by("-created", "-id").first()

    def resume_point(self) -> Checkpoint | None:
        """The checkpoint a resume of this run starts from: its newest kept one, or for a resume that
        stopped before writing one, the checkpoint it resumed from itself (still kept)."""
        own = self.checkpoints.kept().newest()
        if own is not None or self.resumed_from_id is None:
            return own
        try:
            path = self.to_config().checkpoint.resume_from
        except ValueError:
            return None
        return Checkpoint.objects.kept().filter(run_id=self.resumed_from_id, path=path).first() if path else None

    @property
    def progress_percent(self) -> int:
        return int(100 * self.step / self.total_steps) if self.total_steps else 0

    def eta_seconds(self, now: Any = None) -> float | None:
        """Time left for a running run, by the engine's estimate (`eta`: its own step, evaluation
        and checkpoint times); None while it cannot tell (before the first step)."""
        if self.status != self.Status.RUNNING or self.eta is None:
            return None
        return max(0.0, (self.eta - (now or timezone.now())).total_seconds())

    def metric_lineage(self) -> models.Q:
        """The metric points of this run's charts: its own, and for a resumed run its ancestors'
        up to the step each was resumed from, so the curves continue where the old run stopped
        (a resumed run's first step is its checkpoint's step + 1)."""
        lineage = models.Q(run_id=self.pk)
        child, parent_id, seen = self, self.resumed_from_id, {self.pk}
        while parent_id is not None and parent_id not in seen and child.resumed_at_step is not None:
            lineage |= models.Q(run_id=parent_id, step__lte=child.resumed_at_step)
            seen.add(parent_id)
            parent = Run.objects.filter(pk=parent_id).only("pk", "resumed_from_id", "resumed_at_step").first()
            if parent is None:
                break
            child, parent_id = parent, parent.resumed_from_id
        return lineage

    def to_config(self) -> RunConfig:
        """The RunConfig this run executes, rebuilt and re-validated from its snapshot."""
        return RunConfig.from_yaml(self.config_yaml)

    def reads(self) -> dict[str, str]:
        """The files this run's config reads when it starts (field -> path): the checkpoint it
        resumes (`checkpoint.resume_from`) or starts from (`model.init_from.run`), and the dataset
        files it learns from (`data.path`, `sft.path`). What a deletion must not take from a queued
        or running run. Empty for a snapshot that no longer loads."""
        try:
            config = self.to_config()
        except ValueError:
            return {}
        found = {"checkpoint.resume_from": config.checkpoint.resume_from, "model.init_from.run": config.model.init_from.run,
                 "data.path": config.data.path, "sft.path": config.sft.path}
        return {field: str(path) for field, path in found.items() if path}


class MetricPoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points")
    step = models.PositiveIntegerField()
    values = models.JSONField(default=dict)
    agents = models.JSONField(default=dict)
    time = models.DateTimeField()

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="metricpoint_unique_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"


class PlayedEpisode(models.Model):
    """What a played episode stores, in training (`Rollout`) or held-out (`EvaluationEpisode`); the
    episode viewer (runs/_episodes.html) shows either."""

    agent_names = models.JSONField(default=list)
    success = models.BooleanField(default=False)
    team_reward = models.FloatField(default=0.0)
    data = models.JSONField(default=dict, help_text="The episode: turns with every candidate and its reward.")

    class Meta:
        abstract = True

    @classmethod
    def played(cls, episode: dict[str, Any], /, **fields: Any) -> Self:
        """A row for an episode the engine reported (unsaved), keeping its outcome, team reward, the
        agents that acted (in turn order, each once) and the episode; `fields`: where it belongs."""
        return cls(success=bool(episode.get("success")), team_reward=float(episode.get("team_reward") or 0.0),
                   agent_names=list(dict.fromkeys(t.get("agent", "") for t in episode.get("turns", []))),
                   data=storable(episode), **fields)


class Rollout(PlayedEpisode):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollouts")
    step = models.PositiveIntegerField()
    episode = models.PositiveIntegerField(help_text="Index of the episode within its step.")

    class Meta:
        ordering = ["step", "episode"]
        indexes = [models.Index(fields=["run", "step", "episode"], name="rollout_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} episode {self.episode}"


class CheckpointQuerySet(models.QuerySet["Checkpoint"]):
    def kept(self) -> CheckpointQuerySet:
        """Those whose files are still there (`deleted` unset)."""
        return self.filter(deleted__isnull=True)

    def newest(self) -> Checkpoint | None:
        """The one of the highest step, or None."""
        return self.order_by("-step").first()


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    created = models.DateTimeField(default=timezone.now)
    deleted = models.DateTimeField(
        null=True, blank=True, help_text="When its files went (checkpoint.keep, or a team admin); the row stays for the record.",
    )

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step}"


class Evaluation(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="evaluations")
    step = models.PositiveIntegerField()
    temperature = models.FloatField(default=0.0)
    team_success = models.FloatField()
    agents = models.JSONField(default=dict, help_text="Agent name -> {success, reward}.")
    data = models.JSONField(default=dict, help_text="The full evaluation result.")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["step", "temperature"]
        indexes = [models.Index(fields=["run", "step"], name="evaluation_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} T={self.temperature:g}"


class EvaluationEpisode(PlayedEpisode):
    """One held-out task as the agents played it in an evaluation (the run page's held-out table
    links each evaluation's episodes): rows apart from the evaluation, so its numbers stay small."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="episodes")
    episode = models.PositiveIntegerField(help_text="Index of the task within the evaluation.")

    class Meta:
        ordering = ["evaluation", "episode"]

    def __str__(self) -> str:
        return f"evaluation {self.evaluation_id} episode {self.episode}"

    @property
    def step(self) -> int:
        """The evaluation's step (what the episode viewer shows of a rollout)."""
        return self.evaluation.step


class LogLine(models.Model):
    class Level(models.TextChoices):
        DEBUG = "debug", "debug"
        INFO = "info", "info"
        WARNING = "warning", "warning"
        ERROR = "error", "error"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="log_lines")
    time = models.DateTimeField(default=timezone.now)
    level = models.CharField(max_length=10, default="info")
    message = models.TextField()

    class Meta:
        ordering = ["time", "id"]
        indexes = [models.Index(fields=["run", "time"], name="logline_run_time")]

    def __str__(self) -> str:
        return f"[{self.level}] {self.message[:60]}"
