"""The team's own rewards and tasks, defined in the browser: graders and tasks (`agents.graders`,
`agents.envs.task`). A topology plays a task as the `task` environment with `env_args
{"task": "<name>"}`; a run's config snapshot holds the whole definition as it was at launch
(`webapp.catalog.selectors.task_env_args`)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.urls import reverse
from django.utils import timezone

from agents.graders import KINDS, GraderError, check_grader
from webapp.models.catalog import Dataset
from webapp.models.teams import Team

grader_name_validator = RegexValidator(
    r"^[A-Za-z][A-Za-z0-9_-]{0,39}$",
    "Start with a letter; use letters, digits, - or _ (at most 40). The run page charts the grader under this name.",
)
role_name_validator = RegexValidator(r"^[A-Za-z][A-Za-z0-9_-]{0,59}$", "Start with a letter; use letters, digits, - or _ (at most 60).")


class Grader(models.Model):
    """A way to score a completion against a dataset row: its kind and that kind's settings."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="graders")
    name = models.CharField(max_length=40, validators=[grader_name_validator])
    kind = models.CharField(max_length=20, choices=list(KINDS.items()))
    description = models.CharField(max_length=500, blank=True)
    settings = models.JSONField(default=dict, blank=True, help_text="The kind's settings (column, pattern, tolerance, schema, weights...).")
    code = models.TextField(blank=True, help_text="A Python grader's code: def grade(completion, row): ... (run in the sandbox).")
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="grader_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("grader_edit", args=[self.pk])

    def spec(self) -> dict[str, Any]:
        """The grader as `agents.graders` takes it: `{"kind": ..., **settings}` (and `code`)."""
        out: dict[str, Any] = {"kind": self.kind, **(self.settings if isinstance(self.settings, dict) else {})}
        if self.kind == "python":
            out["code"] = self.code
        if self.description:
            out["description"] = self.description
        return out

    def clean(self) -> None:
        if not isinstance(self.settings, dict):
            raise ValidationError({"settings": "A mapping of the kind's settings."})
        if "kind" in self.settings or "code" in self.settings:
            raise ValidationError({"settings": "Give the kind and the code in their own fields, not in the settings."})
        names = list(Grader.objects.filter(team_id=self.team_id).exclude(pk=self.pk).values_list("name", flat=True)) + [self.name]
        try:
            check_grader(self.spec(), where=self.name or "grader", names=names)
        except GraderError as exc:
            field = exc.field.rpartition(".")[2]
            raise ValidationError({"code" if field == "code" else "settings" if field not in ("kind", "description") else field:
                                   f"{exc.field}: {exc.message}"}) from None


class Task(models.Model):
    """A task from a dataset and graders: roles (in turn order) prompted from a row's columns, each
    rewarded by a grader, and the team's reward (a grader on one role's answer)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tasks")
    name = models.CharField(max_length=100)
    description = models.CharField(max_length=500, blank=True)
    dataset = models.ForeignKey(Dataset, on_delete=models.SET_NULL, null=True, blank=True, related_name="tasks",
                                help_text="The dataset it is written for (tried on its first rows).")
    roles = models.JSONField(default=list, help_text="[{name, prompt, sees_turns, grader}], in turn order.")
    team_grader = models.CharField(max_length=40, blank=True, help_text="The grader of the team reward (none: 0).")
    team_role = models.CharField(max_length=60, blank=True, help_text="The role whose latest answer the team grader scores.")
    rounds = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(8)])
    created = models.DateTimeField(default=timezone.now)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="task_unique_team_name")]

    def __str__(self) -> str:
        return self.name

    def get_absolute_url(self) -> str:
        return reverse("task_edit", args=[self.pk])

    def role_names(self) -> list[str]:
        return [str(r.get("name")) for r in self.roles if isinstance(r, dict)] if isinstance(self.roles, list) else []

    def grader_names(self) -> list[str]:
        """The graders it names directly (its roles' and the team's), in order."""
        named = [r.get("grader") for r in self.roles if isinstance(r, dict)] if isinstance(self.roles, list) else []
        return list(dict.fromkeys(str(n) for n in [*named, self.team_grader] if n))

    def clean(self) -> None:
        from training.config import ConfigError
        from webapp.core import trust

        try:
            trust.check_name(self.name)
        except ConfigError as exc:
            raise ValidationError({"name": exc.message}) from None
        if self.dataset_id and self.team_id and self.dataset.team_id != self.team_id:
            raise ValidationError({"dataset": "Pick one of your team's datasets."})
        if bool(self.team_grader) != bool(self.team_role):
            raise ValidationError({"team_grader": "Give both the team's grader and the role it scores, or neither."})
