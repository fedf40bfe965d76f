"""Teams and who belongs to them: the team, its members, their API tokens, invitations and the
audit trail of what members did. Every other object belongs to one team."""

from __future__ import annotations

from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.db import models
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone

from webapp.core import paths


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
        runs = [paths.run_dir(pk).resolve() for pk in self.runs.values_list("pk", flat=True)]
        return [*runs, paths.exports_dir(self.pk).resolve()]

    def dataset_files(self, *, conversations: bool = False) -> set[Path]:
        """The files of the team's uploaded datasets, resolved: task datasets (a run's `data.path`),
        or with `conversations` the conversations datasets (an SFT run's `sft.path`)."""
        if self.pk is None:
            return set()
        kinds = self.datasets.exclude(file="")
        kinds = kinds.filter(kind="chats") if conversations else kinds.exclude(kind="chats")
        return {(paths.data_dir() / f).resolve() for f in kinds.values_list("file", flat=True)}

    def checkpoint_step(self, path: str) -> int | None:
        """The step of `path` if it is a checkpoint a new run may start or resume from: one still on
        disk (not deleted) of one of the team's finished runs (a running run's checkpoints may be
        rotated away before the new run starts). None otherwise."""
        if self.pk is None:
            return None
        checkpoints, runs = apps.get_model("webapp", "Checkpoint"), apps.get_model("webapp", "Run")  # (they import this module)
        return (checkpoints.objects.filter(run__team_id=self.pk, path=path, deleted__isnull=True)
                .exclude(run__status__in=runs.ACTIVE).values_list("step", flat=True).first())


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
