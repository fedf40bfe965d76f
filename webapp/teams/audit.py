"""The team's audit trail: who created, launched, cancelled, resumed, deleted or exported what,
and who invited, removed or changed the role of whom.

The services that do those things call `audit_record` in the same transaction as the change
(teams sits below catalog, artifacts, jobs and runs, so each of them can). An `actor` of None is
Troupe itself: the demo data, a worker, a script that names no user.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model, QuerySet

from webapp.models import AuditEvent, Checkpoint, Invitation, Job, Membership, Team

Verb = AuditEvent.Verb
JOB_TYPES = {Job.Kind.EVALUATE: "evaluation", Job.Kind.MERGE: "export", Job.Kind.PLAYGROUND: "playground job"}


def audit_record(*, team: Team | int, actor: AbstractBaseUser | AnonymousUser | None, verb: str, obj: Model,
                 **details: Any) -> AuditEvent:
    """Store one event. Call it before a delete (the object's id and label are read from `obj`).
    `details` are what the trail shows beside the object (JSON values; dates and decimals become
    text)."""
    if verb not in Verb.values:
        raise ValueError(f"unknown audit verb {verb!r}; one of {', '.join(Verb.values)}")
    user = actor if actor is not None and actor.is_authenticated else None
    object_type, object_id, label = _describe(obj)
    return AuditEvent.objects.create(
        team_id=team if isinstance(team, int) else team.pk, actor=user, actor_name=user.get_username() if user else "",
        verb=verb, object_type=object_type, object_id=object_id, object_label=label[:200],
        details=_jsonable(details),
    )


def _describe(obj: Model) -> tuple[str, int | None, str]:
    """(type, id, label) as the trail shows them."""
    if isinstance(obj, Membership):
        return "member", obj.user_id, obj.user.get_username()
    if isinstance(obj, Invitation):
        return "invitation", obj.pk, obj.email or "a link"
    if isinstance(obj, Checkpoint):
        return "checkpoint", obj.pk, f"run #{obj.run_id} step {obj.step}"
    if isinstance(obj, Job):
        kind = JOB_TYPES.get(obj.kind, obj.kind)
        return kind, obj.pk, f"#{obj.pk}" + (f" of run #{obj.run_id}" if obj.run_id else "")  # the type is shown beside it
    name = obj._meta.verbose_name
    return str(name), obj.pk, str(obj)


def _jsonable(details: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(details, cls=DjangoJSONEncoder))


# == reading the trail (the Audit page) ================================================================

SYSTEM_ACTOR = "(troupe)"
"""The Audit page's actor filter for events with no user (a username cannot hold parentheses)."""


def audit_search(*, team: Team, verb: str = "", actor: str = "", object_type: str = "") -> QuerySet[AuditEvent]:
    """The team's events, newest first; `actor` is a username (as recorded), or SYSTEM_ACTOR."""
    events = AuditEvent.objects.filter(team=team)
    if verb:
        events = events.filter(verb=verb)
    if actor:
        events = events.filter(actor_name="" if actor == SYSTEM_ACTOR else actor)
    if object_type:
        events = events.filter(object_type=object_type)
    return events


def audit_filter_choices(*, team: Team) -> dict[str, list[str]]:
    """The actor names and object types that occur in the team's trail."""
    events = AuditEvent.objects.filter(team=team).order_by()
    return {
        "actors": sorted(events.values_list("actor_name", flat=True).distinct()),
        "object_types": sorted(events.values_list("object_type", flat=True).distinct()),
    }
