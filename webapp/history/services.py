"""The shared experiment history's writes: a run's labels (tags, notes, archive), keyword-only
services like the others. The reads (search, comparison, export) are in `webapp.history.selectors`.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.db import transaction

from webapp.models import Run, Tag

TAG_NAME = re.compile(r"^[\w][\w.:+-]{0,39}$")
"""A tag's name: a letter, digit or _ first; then letters, digits and . : + - _ (at most 40)."""


def run_tags_set(*, run: Run, text: str) -> list[Tag]:
    """Replace a run's tags with the comma-separated names in `text` (created for the team as
    needed; a tag no run uses any more is removed)."""
    names: dict[str, str] = {}
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if not TAG_NAME.match(name):
            raise ValidationError({"tags": f"{name[:50]!r}: use letters, digits and . : + - _ (at most 40, no spaces)."})
        names.setdefault(name.lower(), name)
    if len(names) > 20:
        raise ValidationError({"tags": "At most 20 tags per run."})
    with transaction.atomic():
        existing = {t.name.lower(): t for t in Tag.objects.filter(team_id=run.team_id)}
        tags = [existing.get(key) or Tag.objects.create(team_id=run.team_id, name=name) for key, name in names.items()]
        run.tags.set(tags)
        Tag.objects.filter(team_id=run.team_id, runs=None).delete()
    return sorted(tags, key=lambda t: t.name.lower())


def run_notes_set(*, run: Run, notes: str) -> Run:
    if len(notes) > 20_000:
        raise ValidationError({"notes": "Notes are limited to 20,000 characters."})
    run.notes = notes.replace("\x00", "").strip()
    run.save(update_fields=["notes"])
    return run


def run_archive(*, run: Run, archived: bool) -> Run:
    """Hide a finished run from the list (or bring it back). Active runs stay visible."""
    if archived and run.is_active:
        raise ValidationError("A queued or running run cannot be archived; stop it first.")
    run.archived = archived
    run.save(update_fields=["archived"])
    return run
