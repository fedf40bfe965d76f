"""An experiment: a spec whose trials are ordinary runs."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from django.utils import timezone

from webapp.models.catalog import Dataset, Topology
from webapp.models.runs import Run
from webapp.models.teams import Team


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
