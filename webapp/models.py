"""Troupe's data. Every object belongs to one team (directly, or through its run/topology).

Rules about one row live here (`Run.is_active`, `Run.to_config()`, `Dataset.split`); workflows
that touch several rows live in each package's `services.py` (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone

from training.config import SPECIALIZATIONS, ConfigError, RunConfig
from webapp.core import paths

agent_name_validator = RegexValidator(
    r"^[A-Za-z][A-Za-z0-9_-]{0,39}$",
    "Start with a letter; use letters, digits, - or _ (at most 40). "
    "Checkpoints and LoRA adapters are named after the agent.",
)


SPECIALIZATION_LABELS = {
    "single": "single — one agent acts (L0 baseline)",
    "prompt": "prompt — one shared policy, roles differ by prompt (L1)",
    "lora": "lora — one LoRA adapter per agent on a frozen base (L2)",
    "full": "full — one full model per agent (L3)",
}
SPECIALIZATION_CHOICES = [(s, SPECIALIZATION_LABELS[s]) for s in SPECIALIZATIONS]
SPECIALIZATION_SHORT_CHOICES = [(s, f"{s} (L{level})") for level, s in enumerate(SPECIALIZATIONS)]
"""What a select box shows ("lora (L2)"): the long labels were cut by the box's width; the field's
help text (`SPECIALIZATION_HELP`) says what each means."""
SPECIALIZATION_HELP = "; ".join(label.replace(" — ", ": ", 1) for label in SPECIALIZATION_LABELS.values()) + "."


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    # -- what the trust boundary (webapp/core/trust.py, `TeamFiles`) needs to know of a team's files --

    def model_folders(self) -> list[Path]:
        """The team's own folders a `local:` model source may point into: its runs' outputs
        (checkpoints of `full` agents are model folders) and its merged exports."""
        if self.pk is None:
            return []
        runs = [paths.run_dir(pk).resolve() for pk in Run.objects.filter(team_id=self.pk).values_list("pk", flat=True)]
        return [*runs, paths.exports_dir(self.pk).resolve()]

    def dataset_files(self) -> set[Path]:
        """The files of the team's uploaded datasets, resolved."""
        return {(paths.data_dir() / f).resolve() for f in Dataset.objects.filter(team_id=self.pk).exclude(file="").values_list("file", flat=True)}

    def owns_checkpoint(self, path: str) -> bool:
        """Whether `path` is a checkpoint of one of the team's runs."""
        return Checkpoint.objects.filter(run__team_id=self.pk, path=path).exists()


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user")]
        ordering = ["team__name"]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class ModelSource(models.Model):
    """A base model agents can use, named by an engine source string."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="model_sources")
    name = models.CharField(max_length=100)
    source = models.CharField(
        max_length=500,
        help_text="bundled:smollm2-135m-instruct, tiny-random:llama, local:/path/to/hf-model or hf:org/name",
    )
    notes = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="modelsource_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("model_source_edit", args=[self.pk])

    def clean(self) -> None:
        from webapp.core import trust

        with _field_errors("name"):
            trust.check_name(self.name)
        with _field_errors("source"):
            trust.check_model_source(team=self.team if self.team_id else Team(), source=self.source, field="source")


class Agent(models.Model):
    """An LLM agent: a role in an environment, instructions, a model and sampling settings."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="agents")
    name = models.CharField(max_length=40, validators=[agent_name_validator])
    role = models.CharField(max_length=60, help_text="The environment role it plays (math_tool: tool or reasoner).")
    instructions = models.TextField(blank=True, help_text="System prompt for the role.")
    model_source = models.ForeignKey(ModelSource, on_delete=models.PROTECT, related_name="agents")
    temperature = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(5.0)],
        help_text="Sampling temperature in training; empty uses the run's.",
    )
    max_new_tokens = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(4096)],
        help_text="Completion length cap per turn; empty uses the run's.",
    )
    tools = models.JSONField(default=list, blank=True, help_text="Names of the tools the agent may call.")
    trainable = models.BooleanField(default=True, help_text="Untrainable agents act but are never updated.")
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="agent_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("agent_edit", args=[self.pk])

    def clean(self) -> None:
        if self.model_source_id and self.team_id and self.model_source.team_id != self.team_id:
            raise ValidationError({"model_source": "Pick one of your team's models."})
        if not isinstance(self.tools, list) or not all(isinstance(t, str) for t in self.tools):
            raise ValidationError({"tools": "A list of tool names."})
        from webapp.core import trust

        if len(self.instructions or "") > trust.MAX_STRING:
            raise ValidationError({"instructions": f"At most {trust.MAX_STRING:,} characters (this is {len(self.instructions):,})."})
        if len(self.tools) > 32 or any(len(t) > 60 for t in self.tools):
            raise ValidationError({"tools": "At most 32 tool names of at most 60 characters each."})


class Topology(models.Model):
    """Ordered agents acting together in one environment."""


    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="topologies")
    name = models.CharField(max_length=100)
    environment = models.CharField(max_length=200)
    env_args = models.JSONField(default=dict, blank=True)
    max_turns = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1), MaxValueValidator(64)])
    specialization = models.CharField(max_length=10, choices=SPECIALIZATION_CHOICES, default="lora")
    agents = models.ManyToManyField(Agent, through="TopologyAgent", related_name="topologies")
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "topologies"
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="topology_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("topology_edit", args=[self.pk])

    def clean(self) -> None:
        from webapp.core import trust

        with _field_errors("name"):
            trust.check_name(self.name)
        with _field_errors("environment"):
            trust.check_environment(self.environment, field="environment")
        with _field_errors("env_args"):
            trust.check_env_args(self.env_args)

    def ordered_agents(self) -> list[Agent]:
        return [ta.agent for ta in self.members.select_related("agent__model_source").order_by("position")]


class TopologyAgent(models.Model):
    topology = models.ForeignKey(Topology, on_delete=models.CASCADE, related_name="members")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="memberships")
    position = models.PositiveIntegerField()

    class Meta:
        ordering = ["position"]
        constraints = [
            models.UniqueConstraint(fields=["topology", "position"], name="topologyagent_unique_position"),
            models.UniqueConstraint(fields=["topology", "agent"], name="topologyagent_unique_agent"),
        ]

    def __str__(self) -> str:
        return f"{self.position}. {self.agent}"


class Dataset(models.Model):
    """Task rows for an environment: an uploaded JSONL/CSV file or the environment's generator."""

    class Kind(models.TextChoices):
        UPLOAD = "upload", "Uploaded file"
        GENERATOR = "generator", "Built-in generator"

    class Format(models.TextChoices):
        JSONL = "jsonl", "JSONL"
        CSV = "csv", "CSV"

    class Status(models.TextChoices):
        VALID = "valid", "Valid"
        INVALID = "invalid", "Invalid"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    environment = models.CharField(max_length=200, help_text="The environment whose fields the rows must have.")
    env_args = models.JSONField(default=dict, blank=True, help_text="Generator arguments (math_tool: level 1-3).")
    # Generator datasets: how many rows to generate.
    size = models.PositiveIntegerField(null=True, blank=True, help_text="Generated training tasks.")
    eval_size = models.PositiveIntegerField(null=True, blank=True, help_text="Generated held-out tasks.")
    # Uploaded datasets: the stored file (relative to the data dir, a random name) and what it holds.
    file = models.CharField(max_length=300, blank=True)
    original_filename = models.CharField(max_length=255, blank=True)
    format = models.CharField(max_length=10, choices=Format.choices, blank=True)
    size_bytes = models.PositiveBigIntegerField(default=0)
    eval_fraction = models.FloatField(
        default=0.1, validators=[MinValueValidator(0.0), MaxValueValidator(0.9)],
        help_text="Share of an uploaded file's rows held out for evaluation.",
    )
    row_count = models.PositiveIntegerField(default=0)
    schema = models.JSONField(default=list, blank=True, help_text="Field names, in file order.")
    preview = models.JSONField(default=list, blank=True, help_text="The first rows.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.VALID)
    status_message = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="dataset_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("dataset_detail", args=[self.pk])

    def clean(self) -> None:
        from webapp.core import trust

        with _field_errors("name"):
            trust.check_name(self.name)
        with _field_errors("environment"):
            trust.check_environment(self.environment, field="environment")
        with _field_errors("env_args"):
            trust.check_env_args(self.env_args)

    @property
    def path(self) -> Path | None:
        """Absolute path of the stored file (uploads only)."""
        return Path(settings.TROUPE_DATA_DIR) / self.file if self.file else None

    @property
    def split(self) -> tuple[int, int]:
        """(train rows, eval rows). Uploads hold out `eval_fraction` of their rows, rounded, as
        `training.data.split_rows` does (a single row is never held out)."""
        if self.kind == self.Kind.GENERATOR:
            return self.size or 0, self.eval_size or 0
        held_out = round(self.row_count * self.eval_fraction) if self.row_count > 1 else 0
        return self.row_count - held_out, held_out

    @property
    def preview_rows(self) -> list[list[Any]]:
        """The stored first rows as cells in schema order (for a table)."""
        return [[row.get(f, "") for f in self.schema] for row in self.preview]


def queue_clock() -> int:
    """Microseconds since the epoch: a new queued run's place (`Run.queue_order`), behind the others."""
    return time.time_ns() // 1000


def gpu_queue(gpus: int) -> str:
    """The Celery queue of runs that need `gpus` GPUs: `gpu` for one, `gpu-x<N>` for N. A worker
    serves the queues of the GPU counts it has (`-Q gpu` on a one-GPU worker, `-Q gpu-x2` on a
    worker with two)."""
    return "gpu" if gpus <= 1 else f"gpu-x{gpus}"


RAY_QUEUE = "ray"
"""The Celery queue of runs on several hosts (`resources.hosts > 1`): the worker beside the Ray
cluster's head serves it (`-Q ray`) and submits each run to the cluster (docs/deploy.md)."""


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
    # The shared history (webapp/history/services.py): searchable notes, tags, archive, and two config
    # facts copied out of the snapshot at creation so the list filters on indexed columns.
    notes = models.TextField(blank=True)
    tags = models.ManyToManyField("Tag", blank=True, related_name="runs")
    archived = models.BooleanField(default=False, help_text="Hidden from the run list unless asked for.")
    environment = models.CharField(max_length=200, blank=True, help_text="config.topology.environment")
    specialization = models.CharField(max_length=10, blank=True, help_text="config.topology.specialization")
    gpus = models.PositiveSmallIntegerField(
        default=1, help_text="config.resources.gpus: the run waits on the queue of workers with that many GPUs (gpu, gpu-x2, ...).",
    )
    hosts = models.PositiveSmallIntegerField(
        default=1, help_text="config.resources.hosts: more than one, the run waits on the `ray` queue (a worker beside a Ray cluster).",
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
        return RAY_QUEUE if self.hosts > 1 else gpu_queue(self.gpus)

    @property
    def is_active(self) -> bool:
        return self.status in self.ACTIVE

    @property
    def can_cancel(self) -> bool:
        return self.is_active and not self.cancel_requested

    @property
    def can_resume(self) -> bool:
        """Failed or cancelled: a new run can continue from its latest checkpoint (if it has one)."""
        return self.status in (self.Status.FAILED, self.Status.CANCELLED)

    @property
    def progress_percent(self) -> int:
        return int(100 * self.step / self.total_steps) if self.total_steps else 0

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


class Experiment(models.Model):
    """A base config, axes and seeds (`training.experiment.ExperimentSpec`, stored as YAML) whose
    trials are ordinary runs (`Run.experiment`, `Run.trial_index`). Its state is its runs': it is
    active while a trial is queued or running (`status`)."""

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        FINISHED = "finished", "Finished"
        CANCELLED = "cancelled", "Cancelled"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="experiments")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="experiments")
    name = models.CharField(max_length=100)
    topology = models.ForeignKey(Topology, on_delete=models.SET_NULL, null=True, blank=True, related_name="experiments")
    dataset = models.ForeignKey(Dataset, on_delete=models.SET_NULL, null=True, blank=True, related_name="experiments")
    spec_yaml = models.TextField(help_text="The ExperimentSpec: base config snapshot, axes, seeds, metric and direction "
                                           "(`python -m training sweep` runs it as it is).")
    trial_count = models.PositiveIntegerField(default=0, help_text="Arms x seeds.")
    created = models.DateTimeField(default=timezone.now)
    cancelled = models.DateTimeField(null=True, blank=True, help_text="When someone cancelled it (resume clears it).")
    notes = models.TextField(blank=True)

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [models.Index(fields=["team", "-created"], name="experiment_team_created")]

    def __str__(self) -> str:
        return f"experiment #{self.pk} {self.name}"

    def get_absolute_url(self) -> str:
        return reverse("experiment_detail", args=[self.pk])

    def to_spec(self) -> Any:
        """The ExperimentSpec, rebuilt and re-checked from its snapshot."""
        from training.experiment import ExperimentSpec

        return ExperimentSpec.from_yaml(self.spec_yaml)

    @property
    def status(self) -> str:
        if self.runs.filter(status__in=Run.ACTIVE).exists():
            return self.Status.ACTIVE
        return self.Status.CANCELLED if self.cancelled else self.Status.FINISHED

    @property
    def is_active(self) -> bool:
        return self.status == self.Status.ACTIVE


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


class Rollout(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollouts")
    step = models.PositiveIntegerField()
    episode = models.PositiveIntegerField(help_text="Index of the episode within its step.")
    agent_names = models.JSONField(default=list)
    success = models.BooleanField(default=False)
    team_reward = models.FloatField(default=0.0)
    data = models.JSONField(default=dict, help_text="The episode: turns with every candidate and its reward.")

    class Meta:
        ordering = ["step", "episode"]
        indexes = [models.Index(fields=["run", "step", "episode"], name="rollout_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} episode {self.episode}"


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    path = models.CharField(max_length=500)
    created = models.DateTimeField(default=timezone.now)
    deleted = models.DateTimeField(
        null=True, blank=True, help_text="When its files went (checkpoint.keep, or a team admin); the row stays for the record.",
    )

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



class Tag(models.Model):
    """A label on runs, shared by the team (`baseline`, `paper-fig-2`)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=40)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="tag_unique_team_name")]

    def __str__(self) -> str:
        return self.name


class Job(models.Model):
    """Work a user asks of a GPU worker besides training: evaluate a checkpoint on a dataset, merge a
    LoRA adapter into its base for export, or play one task in the playground. The row is the
    job's state (claimed atomically like a run); `result` grows while it runs (playground turns)."""

    class Kind(models.TextChoices):
        EVALUATE = "evaluate", "Evaluation"
        MERGE = "merge", "Merged export"
        PLAYGROUND = "playground", "Playground"

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


class ApiToken(models.Model):
    """A personal API token for one team. Only its SHA-256 digest is stored; the token itself is
    shown once, when it is created. Tokens are 256-bit random strings, so a fast hash suffices."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The token's first characters, to recognise it.")
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked is None


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



@contextlib.contextmanager
def _field_errors(field: str) -> Iterator[None]:
    """Turn a trust-boundary ConfigError into a ValidationError on one model field."""
    try:
        yield
    except ConfigError as exc:
        raise ValidationError({field: exc.message}) from None


class Invitation(models.Model):
    """A link that adds one person to a team with a role. Only the token's SHA-256 digest is
    stored; the link is shown once to the admin who made it (and emailed when an address is
    given). It works once, until it expires or is revoked."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="invitations")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    email = models.EmailField(blank=True, help_text="Where the link was emailed (optional).")
    role = models.CharField(max_length=10, choices=Membership.Role.choices, default=Membership.Role.MEMBER)
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(default=timezone.now)
    expires = models.DateTimeField()
    accepted = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"invitation to {self.team} as {self.role}" + (f" for {self.email}" if self.email else "")

    @property
    def is_pending(self) -> bool:
        return self.accepted is None and self.revoked is None and self.expires > timezone.now()


class AuditEvent(models.Model):
    """One thing a member did to the team's objects: who, what verb, on what, when. Written by the
    services that do it (`webapp.teams.audit.audit_record`), never edited. The actor's name and the
    object's label are copied, so the record reads the same after either is deleted."""

    class Verb(models.TextChoices):
        CREATE = "create", "created"
        LAUNCH = "launch", "launched"
        CANCEL = "cancel", "cancelled"
        RESUME = "resume", "resumed"
        DELETE = "delete", "deleted"
        EXPORT = "export", "exported"
        INVITE = "invite", "invited"
        JOIN = "join", "joined"
        REVOKE = "revoke", "revoked"
        ROLE = "role", "changed the role of"
        REMOVE = "remove", "removed"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+",
                              help_text="Empty: Troupe itself (the demo data, a worker), or a deleted user (see actor name).")
    actor_name = models.CharField(max_length=150, blank=True)
    verb = models.CharField(max_length=10, choices=Verb.choices)
    object_type = models.CharField(max_length=40, help_text="run, agent, dataset, checkpoint, member, ...")
    object_id = models.BigIntegerField(null=True, blank=True)
    object_label = models.CharField(max_length=200, blank=True)
    time = models.DateTimeField(default=timezone.now)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [models.Index(fields=["team", "-time"], name="audit_team_time"),
                   models.Index(fields=["team", "verb", "-time"], name="audit_team_verb_time")]

    def __str__(self) -> str:
        return f"{self.actor_name or 'Troupe'} {self.get_verb_display()} {self.object_type} {self.shown_label}"

    @property
    def shown_label(self) -> str:
        """The label to show after the type: without the type again (events recorded before jobs'
        labels dropped it read "evaluation evaluation #5")."""
        repeated = f"{self.object_type} #{self.object_id}"
        label = self.object_label
        return label[len(self.object_type) + 1:] if label == repeated or label.startswith(repeated + " ") else label

    @property
    def object_url(self) -> str:
        """The object's page, for runs (never deleted; other objects may be gone since)."""
        return reverse("run_detail", args=[self.object_id]) if self.object_type == "run" and self.object_id else ""

    def detail_items(self) -> list[tuple[str, str, str]]:
        """The details as the Audit page shows them: (label, text, link), empty values left out."""
        items = []
        for key, value in (self.details or {}).items():
            if value in (None, False, "", [], {}):
                continue
            text = (filesizeformat(value) if key == "bytes" else "yes" if value is True
                    else ", ".join(map(str, value)) if isinstance(value, list) else str(value))
            url = reverse("run_detail", args=[value]) if key == "new_run" and isinstance(value, int) else ""
            items.append((key.replace("_", " "), f"#{value}" if url else text, url))
        return items
