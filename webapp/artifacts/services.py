"""What a team admin may delete to make room: a run's older checkpoints and merged exports.

The data dir holds each run's output (checkpoints: a LoRA adapter is a few MB, a full model
hundreds), merged exports (a whole model each), uploaded datasets and the converted-model cache
that every team shares. `/storage/` shows the team's share and the cache, with the disk's free
space; a team admin deletes a run's older checkpoints (never the latest: it resumes the run and
serves the playground and exports) and merged exports, from the run page or from there.

GGUF exports are merge jobs (`webapp.jobs.services.gguf_request`), so they list, download and delete
like the merged safetensors exports.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.artifacts.selectors import checkpoint_delete_blocker, folder_size
from webapp.core import paths
from webapp.models import Checkpoint, Job
from webapp.teams.audit import Verb, audit_record


def checkpoint_delete(*, checkpoint: Checkpoint, actor: User | None = None) -> None:
    """Delete a finished run's older checkpoint from disk; its row stays, marked deleted."""
    if blocker := checkpoint_delete_blocker(checkpoint=checkpoint):
        raise ValidationError(blocker)
    folder = Path(checkpoint.path)
    if not paths.inside(folder, Path(checkpoint.run.out_dir), strictly=True):
        raise ValidationError("This checkpoint is not in the run's output folder; Troupe leaves it alone.")
    size = folder_size(folder)
    shutil.rmtree(folder, ignore_errors=True)
    with transaction.atomic():
        Checkpoint.objects.filter(pk=checkpoint.pk).update(deleted=timezone.now())
        audit_record(team=checkpoint.run.team_id, actor=actor, verb=Verb.DELETE, obj=checkpoint, bytes=size)


def export_delete(*, job: Job, actor: User | None = None) -> None:
    """Delete a merged export's folder; the job stays in the list, marked deleted."""
    if job.kind != Job.Kind.MERGE or job.is_active:
        raise ValidationError("Only a finished export can be deleted.")
    size = 0
    if job.output:
        if not paths.inside(Path(job.output), paths.exports_dir(job.team_id), strictly=True):
            raise ValidationError("This export is not in the team's exports folder; Troupe leaves it alone.")
        size = folder_size(job.output)
        shutil.rmtree(job.output, ignore_errors=True)
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(output="", result={**(job.result or {}), "deleted": timezone.now().isoformat()})
        audit_record(team=job.team_id, actor=actor, verb=Verb.DELETE, obj=job, bytes=size, agent=(job.params or {}).get("agent"))
