"""The team's catalog: base models, agents, topologies (agents acting together) and datasets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from training.config import SPECIALIZATIONS, ConfigError
from webapp.models.teams import Team

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

    def clean(self) -> None:
        if self.topology_id and self.agent_id and self.agent.team_id != self.topology.team_id:
            raise ValidationError({"agent": "Pick one of the topology's team's agents."})


class Dataset(models.Model):
    """Task rows for an environment: an uploaded JSONL/CSV file or the environment's generator."""

    class Kind(models.TextChoices):
        UPLOAD = "upload", "Uploaded file"
        GENERATOR = "generator", "Built-in generator"
        CHATS = "chats", "Conversations (SFT)"

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


@contextlib.contextmanager
def _field_errors(field: str) -> Iterator[None]:
    """Turn a trust-boundary ConfigError into a ValidationError on one model field."""
    try:
        yield
    except ConfigError as exc:
        raise ValidationError({field: exc.message}) from None
