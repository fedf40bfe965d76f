"""What Troupe keeps on disk, as the storage page and the run page's artifacts section show it, and
what blocks (or comes with) a team admin's deletion of a checkpoint or a merged export."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.template.defaultfilters import filesizeformat

from training.config import ConfigError
from webapp.artifacts import files
from webapp.models import Checkpoint, Dataset, Job, Run, Team

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
        count = sum(1 for c in run.checkpoints.kept() if Path(c.path).is_dir())
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


# == the run page's artifacts section ============================================================


def run_artifacts_section(*, run: Run) -> dict[str, Any]:
    """The artifacts section: checkpoints on disk with their sizes and whether they may be deleted,
    the ones deleted, merged exports with their sizes."""
    merge_jobs = list(run.jobs.filter(kind=Job.Kind.MERGE)[:20])
    found = files.run_artifacts(run=run)
    return {
        "artifacts": found,
        "deletable": {c.pk for c in run.checkpoints.kept() if checkpoint_delete_blocker(checkpoint=c) is None},
        "deleted_steps": sorted({c.step for c in run.checkpoints.filter(deleted__isnull=False)}
                                | {a.checkpoint.step for a in found if not a.on_disk}),
        "merge_jobs": merge_jobs,
        "export_sizes": {job.pk: folder_size(job.output) for job in merge_jobs if job.output},
        "model_dtype": _model_dtype(run),
    }


def _model_dtype(run: Run) -> str:
    try:
        return run.to_config().model.dtype
    except ConfigError:
        return ""


# == what blocks a deletion, and what goes with it ==================================================


def checkpoint_delete_blocker(*, checkpoint: Checkpoint) -> str | None:
    run = Run.objects.get(pk=checkpoint.run_id)  # its status now, not as the caller loaded it
    if checkpoint.deleted is not None:
        return f"Checkpoint step {checkpoint.step} is already deleted."
    if run.is_active:
        return "The run is still going; it keeps its own latest checkpoints (checkpoint.keep)."
    latest = run.checkpoints.kept().newest()
    if latest is not None and latest.pk == checkpoint.pk:
        return "This is the run's latest checkpoint: it resumes the run and serves the playground and exports. Delete older ones."
    if checkpoint.jobs.filter(status__in=(Job.Status.QUEUED, Job.Status.RUNNING)).exists():
        return "An evaluation, export or playground job is using this checkpoint; wait for it to finish."
    return checkpoint_readers_blocker(team_id=run.team_id, paths=[checkpoint.path])


def checkpoint_readers_blocker(*, team_id: int, paths: list[str]) -> str | None:
    """Why checkpoints at `paths` must stay: the queued or running runs of the team that resume or
    start from one of them (`Run.reads`); None when none does."""
    wanted = set(paths)
    if not wanted:
        return None
    mention = Q()
    for path in wanted:  # only configs that mention the folder's name are read (a path has no space to fold at in the YAML)
        mention |= Q(config_yaml__contains=Path(path).name)
    active = Run.objects.filter(mention, team_id=team_id, status__in=Run.ACTIVE).only("pk", "config_yaml")
    needing = [r.pk for r in active if wanted & set(r.reads().values())]
    if not needing:
        return None
    runs, many = ", ".join(f"#{pk}" for pk in needing), len(needing) > 1
    them = "them" if many else "it"
    return (f"{'Runs' if many else 'Run'} {runs} (queued or running) start{'' if many else 's'} from this checkpoint; "
            f"cancel {them} first, or wait for {them} to end.")


def checkpoint_delete_effects(*, checkpoint: Checkpoint) -> list[str]:
    """What deleting this checkpoint takes with it, for the confirmation page."""
    run = checkpoint.run
    later = list(run.checkpoints.kept().filter(step__gt=checkpoint.step).values_list("step", flat=True))
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
