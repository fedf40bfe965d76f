"""What Troupe keeps on disk, and what a team admin may delete to make room.

The data dir holds each run's output (checkpoints: a LoRA adapter is a few MB, a full model
hundreds), merged exports (a whole model each), uploaded datasets and the converted-model cache
that every team shares. `/storage/` shows the team's share and the cache, with the disk's free
space; a team admin deletes a run's older checkpoints (never the latest: it resumes the run and
serves the playground and exports) and merged exports, from the run page or from there.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from webapp.core import paths
from webapp.models import Checkpoint, Dataset, Job, Run, Team
from webapp.teams.audit import Verb, audit_record

# == what is on disk ================================================================================


def folder_size(path: str | Path | None) -> int:
    """Bytes of the files under `path` (links not followed); 0 when it is missing."""
    if not path:
        return 0
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    if not root.is_dir():
        return 0
    total = 0
    for f in root.rglob("*"):
        try:
            if f.is_file() and not f.is_symlink():
                total += f.stat().st_size
        except OSError:
            continue
    return total


@dataclass
class RunStorage:
    run: Run
    checkpoints: int
    """Checkpoints still on disk."""
    checkpoint_bytes: int
    other_bytes: int
    """The rest of the run's folder (metrics, rollouts, logs)."""
    export_bytes: int


@dataclass
class StorageReport:
    runs: list[RunStorage] = field(default_factory=list)
    dataset_bytes: int = 0
    model_cache: list[tuple[str, int]] = field(default_factory=list)
    """(folder, bytes) of each converted model, shared by every team."""
    disk_free: int = 0
    disk_total: int = 0

    @property
    def team_bytes(self) -> int:
        return sum(r.checkpoint_bytes + r.other_bytes + r.export_bytes for r in self.runs) + self.dataset_bytes

    @property
    def model_cache_bytes(self) -> int:
        return sum(size for _, size in self.model_cache)


def storage_report(*, team: Team) -> StorageReport:
    """The team's runs (largest first), exports and uploads, and the shared model cache."""
    data_dir = Path(settings.TROUPE_DATA_DIR)
    report = StorageReport()
    exports: dict[int, int] = {}
    for job in Job.objects.filter(team=team, kind=Job.Kind.MERGE).exclude(output=""):
        exports[job.run_id or 0] = exports.get(job.run_id or 0, 0) + folder_size(job.output)
    for run in Run.objects.filter(team=team).exclude(out_dir=""):
        total = folder_size(run.out_dir)
        checkpoints = folder_size(Path(run.out_dir) / "checkpoints")
        count = sum(1 for c in run.checkpoints.filter(deleted__isnull=True) if Path(c.path).is_dir())
        if total or exports.get(run.pk):
            report.runs.append(RunStorage(run, count, checkpoints, total - checkpoints, exports.get(run.pk, 0)))
    report.runs.sort(key=lambda r: -(r.checkpoint_bytes + r.other_bytes + r.export_bytes))
    report.dataset_bytes = sum(folder_size(d.path) for d in Dataset.objects.filter(team=team).exclude(file=""))
    models = data_dir / "models"
    if models.is_dir():
        report.model_cache = sorted(((p.name, folder_size(p)) for p in models.iterdir() if p.is_dir() and not p.name.startswith(".")),
                                    key=lambda item: -item[1])
    usage = shutil.disk_usage(data_dir)
    report.disk_free, report.disk_total = usage.free, usage.total
    return report


# == what a team admin may delete ====================================================================


def checkpoint_delete_blocker(*, checkpoint: Checkpoint) -> str | None:
    run = Run.objects.get(pk=checkpoint.run_id)  # its status now, not as the caller loaded it
    if checkpoint.deleted is not None:
        return f"Checkpoint step {checkpoint.step} is already deleted."
    if run.is_active:
        return "The run is still going; it keeps its own latest checkpoints (checkpoint.keep)."
    latest = run.checkpoints.filter(deleted__isnull=True).order_by("-step").first()
    if latest is not None and latest.pk == checkpoint.pk:
        return "This is the run's latest checkpoint: it resumes the run and serves the playground and exports. Delete older ones."
    if checkpoint.jobs.filter(status__in=(Job.Status.QUEUED, Job.Status.RUNNING)).exists():
        return "An evaluation, export or playground job is using this checkpoint; wait for it to finish."
    return None


def checkpoint_delete_effects(*, checkpoint: Checkpoint) -> list[str]:
    """What deleting this checkpoint takes with it, for the confirmation page."""
    run = checkpoint.run
    later = list(run.checkpoints.filter(deleted__isnull=True, step__gt=checkpoint.step).values_list("step", flat=True))
    effects = [f"Its files go from disk: {filesizeformat(folder_size(checkpoint.path))} in {checkpoint.path}.",
               f"Run #{run.pk} can no longer be resumed, evaluated, played or exported from step {checkpoint.step}"
               + (f"; it keeps step{'s' if len(later) > 1 else ''} {', '.join(map(str, later))}." if later else ".")]
    exports = run.jobs.filter(kind=Job.Kind.MERGE, checkpoint=checkpoint).exclude(output="").count()
    if exports:
        effects.append(f"{exports} merged export{'s' if exports > 1 else ''} made from it stay{'' if exports > 1 else 's'}.")
    return effects


def export_delete_effects(*, job: Job) -> list[str]:
    """What deleting this merged export takes with it, for the confirmation page."""
    agent = (job.params or {}).get("agent", "the agent")
    step = job.checkpoint.step if job.checkpoint else None
    effects = [f"The merged model of {agent} goes from disk: {filesizeformat(folder_size(job.output))}"
               + (f" in {job.output}." if job.output else ".")]
    if job.checkpoint is not None and job.checkpoint.deleted is None:
        effects.append(f"Checkpoint step {step} is still on disk: the export can be merged again from it.")
    elif step is not None:
        effects.append(f"Checkpoint step {step} is deleted too: this export cannot be made again.")
    return effects


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

