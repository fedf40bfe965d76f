"""A run's lineage through warm starts: the checkpoint it started from (`model.init_from`) and the
runs that started from one of its checkpoints. Read from the stored configs, within one team."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q

from webapp.models import Checkpoint, Run


@dataclass(frozen=True)
class Origin:
    run: Run | None
    """The source run (None when the folder is no longer one of the team's checkpoints)."""
    step: int
    path: str


def run_origin(*, run: Run) -> Origin | None:
    """Where `run` started from: None for a run that started from its base model."""
    try:
        init = run.to_config().model.init_from
    except Exception:  # noqa: BLE001 (a stored config an older engine wrote: no lineage to show)
        return None
    if not init.run:
        return None
    checkpoint = Checkpoint.objects.select_related("run").filter(run__team_id=run.team_id, path=init.run).first()
    if checkpoint is None:
        return Origin(None, init.step, init.run)
    return Origin(checkpoint.run, checkpoint.step, init.run)


def run_descendants(*, run: Run) -> list[Run]:
    """The team's runs that started from one of `run`'s checkpoints, newest first."""
    paths = list(Checkpoint.objects.filter(run=run).values_list("path", flat=True))
    if not paths:
        return []
    query = Q()
    for path in paths:
        query |= Q(config_yaml__contains=f"run: {path}\n") | Q(config_yaml__contains=f"run: '{path}'\n")
    candidates = Run.objects.filter(team_id=run.team_id).filter(query).exclude(pk=run.pk).order_by("-created")[:50]
    return [r for r in candidates if (origin := run_origin(run=r)) is not None and origin.run is not None and origin.run.pk == run.pk]
