"""What a team admin may delete to make room: a run's older checkpoints and merged exports.

The data dir holds each run's output (checkpoints: a LoRA adapter is a few MB, a full model
hundreds), merged exports (a whole model each), uploaded datasets and the converted-model cache
that every team shares. `/storage/` shows the team's share and the cache, with the disk's free
space; a team admin deletes a run's older checkpoints (never the latest: it resumes the run and
serves the playground and exports) and merged exports, from the run page or from there.

GGUF exports (`gguf_request`, run by the merge job's worker through `gguf_work`): one agent's LoRA
adapter merged into its base and written as one GGUF file (f16 or q8_0) with an Ollama Modelfile,
for llama.cpp and Ollama; they are merge jobs (params `format: gguf`), so they list, download and
delete like the merged safetensors exports.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from webapp.artifacts import files as artifacts
from webapp.artifacts.selectors import checkpoint_delete_blocker, folder_size
from webapp.core import paths
from webapp.models import Checkpoint, Job, Run
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



# == GGUF export ======================================================================================


GGUF_TYPES = {"f16": "GGUF f16", "q8_0": "GGUF q8_0"}  # training.export.GGUF_TYPES, with their labels
"""The GGUF weight types: f16, or q8_0 (8-bit blocks, about half the size; what CPUs serve)."""


def gguf_request(*, run: Run, user: User | None, checkpoint: Checkpoint, agent: str, gguf_type: str = "q8_0") -> Job:
    """Queue merging `agent`'s LoRA adapter at `checkpoint` into the run's base model and writing
    it as one GGUF file of `gguf_type` (GGUF_TYPES) with an Ollama Modelfile. A finished export of
    the same adapter and type whose folder still exists (or one still queued or running) is
    returned instead of a new job. An agent saved as a full model is refused; an architecture
    llama.cpp's converter does not know fails the job with that said, before anything is merged."""
    from webapp.jobs.services import job_create

    if gguf_type not in GGUF_TYPES:
        raise ValidationError({"gguf_type": f"Export GGUF as one of: {', '.join(GGUF_TYPES)}."})
    if checkpoint.run_id != run.pk:
        raise ValidationError({"checkpoint": "Pick one of this run's checkpoints."})
    try:
        _, policy = artifacts.policy_folder(run=run, checkpoint=checkpoint, name=agent)
    except artifacts.ArtifactMissing as exc:
        raise ValidationError({"agent": str(exc)}) from None
    if policy.kind != "adapter":
        raise ValidationError({"agent": f"{agent} is a full model, not a LoRA adapter: there is nothing to merge for a GGUF export."})
    existing = Job.objects.filter(run=run, kind=Job.Kind.MERGE, checkpoint=checkpoint, params__agent=agent, params__format="gguf",
                                  params__gguf_type=gguf_type).exclude(status=Job.Status.FAILED).order_by("-created").first()
    if existing is not None and (existing.is_active or Path(existing.output or "/nonexistent").is_dir()):
        return existing
    return job_create(team=run.team, user=user, kind=Job.Kind.MERGE, run=run, checkpoint=checkpoint,
                      params={"agent": agent, "checkpoint_step": checkpoint.step, "format": "gguf", "gguf_type": gguf_type})


def gguf_work(job: Job) -> dict[str, Any]:
    """The worker's part of a GGUF export job (`webapp.jobs.services.merge_execute` calls it):
    `training.export.export_gguf` into the team's exports folder; returns the job's fields."""
    from training.export import export_gguf  # imports torch: only in the worker

    assert job.run is not None and job.checkpoint is not None
    adapter, _ = artifacts.policy_folder(run=job.run, checkpoint=job.checkpoint, name=job.params["agent"])
    export = export_gguf(
        job.run.to_config(), agent=job.params["agent"], adapter=adapter, out=paths.exports_dir(job.team_id) / f"merge-{job.pk}",
        gguf_type=job.params["gguf_type"],
        about={"run": job.run.pk, "run_name": job.run.name, "checkpoint_step": job.checkpoint.step},
    )
    return {"output": str(export.folder), "result": {"files": export.files, "architecture": export.architecture}}
