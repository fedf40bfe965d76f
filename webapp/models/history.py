"""The shared history's labels on runs."""

from __future__ import annotations

from django.db import models

from webapp.models.teams import Team


class Tag(models.Model):
    """A label on runs, shared by the team (`baseline`, `paper-fig-2`)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=40)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="tag_unique_team_name")]

    def __str__(self) -> str:
        return self.name
