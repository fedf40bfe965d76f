"""Model sources: base models agents can use, named by an engine source string."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction

from webapp.catalog.selectors import model_source_delete_blocker
from webapp.catalog.services.names import check_name_free
from webapp.models import ModelSource, Team
from webapp.teams.audit import Verb, audit_record


def model_source_save(*, team: Team, name: str, source: str, notes: str = "", instance: ModelSource | None = None,
                      actor: User | None = None) -> ModelSource:
    """Create or update a model source; `ModelSource.clean` checks the source like the engine.
    `actor` (here and below): the member doing it, for the audit trail (None: Troupe itself)."""
    obj = instance or ModelSource(team=team)
    obj.name, obj.source, obj.notes = name, source, notes
    check_name_free(obj)
    obj.full_clean()
    with transaction.atomic():
        obj.save()
        if instance is None:
            audit_record(team=team, actor=actor, verb=Verb.CREATE, obj=obj, source=obj.source)
    return obj


def model_source_delete(*, source: ModelSource, actor: User | None = None) -> None:
    if blocker := model_source_delete_blocker(source=source):
        raise ValidationError(blocker)
    with transaction.atomic():
        audit_record(team=source.team_id, actor=actor, verb=Verb.DELETE, obj=source, source=source.source)
        source.delete()
