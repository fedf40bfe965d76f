"""Names are unique per team: the check the services run before saving, and a free name for a copy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError

from webapp.models import Team


def check_name_free(obj: Any) -> None:
    """Names are unique per team; say so next to the name field (the DB constraint backs it)."""
    taken = type(obj).objects.filter(team_id=obj.team_id, name=obj.name).exclude(pk=obj.pk).exists()
    if taken:
        kind = str(type(obj)._meta.verbose_name)
        raise ValidationError({"name": f"Your team already has {'an' if kind[:1] in 'aeiou' else 'a'} {kind} named {obj.name!r}."})


def free_name(model: Any, team: Team, name: str, *, max_length: int, suffixes: Iterable[str] | None = None) -> str:
    """`name` with the first of `suffixes` that gives a name the team does not use yet: by default
    `name-copy`, `name-copy2`, ... (a copy's name)."""
    if suffixes is None:
        suffixes = ("-copy" if i == 1 else f"-copy{i}" for i in range(1, 1000))
    for suffix in suffixes:
        candidate = name[: max_length - len(suffix)] + suffix
        if not model.objects.filter(team=team, name=candidate).exists():
            return candidate
    raise ValidationError("Too many copies of this name.")
