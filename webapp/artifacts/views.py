"""A run's files: the artifacts section, downloads, LoRA merges' exports and deletions.

Each view: fetch within the current team (another team's object is a 404), call one service,
render or redirect; htmx requests get the page's named partial (`page.html#name`).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from webapp.artifacts import files, selectors, services
from webapp.artifacts.downloads import checkpoint_download, merged_download, run_file_download
from webapp.models import Checkpoint, Job, Run
from webapp.teams.access import TeamRequest, is_team_admin, team_object_or_404


@require_GET
def run_artifacts(request: TeamRequest, pk: int) -> HttpResponse:
    """The artifacts section (htmx polls it while a merged export is being built)."""
    run = team_object_or_404(request, Run, pk)
    return render(request, "history/run_sections.html#artifacts", {"run": run, **selectors.run_artifacts_section(run=run)})


def _team_admin(request: TeamRequest) -> None:
    if not is_team_admin(request):
        raise PermissionDenied("Only a team admin can delete checkpoints and exports.")


@require_http_methods(["GET", "POST"])
def run_checkpoint_delete(request: TeamRequest, pk: int, step: int) -> HttpResponse:
    """A team admin deletes one of a finished run's older checkpoints from disk: GET asks first,
    saying what goes with it; POST deletes."""
    run = team_object_or_404(request, Run, pk)
    checkpoint = get_object_or_404(Checkpoint, run=run, step=step)
    _team_admin(request)
    if request.method == "GET":
        return _confirm(request, run, kind="checkpoint", label=f"step {step} of run #{run.pk}",
                        error=selectors.checkpoint_delete_blocker(checkpoint=checkpoint),
                        effects=selectors.checkpoint_delete_effects(checkpoint=checkpoint), button="Delete from disk")
    return _delete_then_back(request, run, lambda: services.checkpoint_delete(checkpoint=checkpoint, actor=request.user),
                             f"Deleted checkpoint step {step} of run #{run.pk}.")


@require_http_methods(["GET", "POST"])
def run_export_delete(request: TeamRequest, pk: int, job_id: int) -> HttpResponse:
    """A team admin deletes a merged export: GET asks first, POST deletes."""
    run = team_object_or_404(request, Run, pk)
    job = get_object_or_404(Job, pk=job_id, run=run, kind=Job.Kind.MERGE)
    _team_admin(request)
    agent = job.params.get("agent", "the agent")
    if request.method == "GET":
        return _confirm(request, run, kind="merged export", label=f"of {agent} (job #{job.pk})",
                        error=None if job.output and not job.is_active else "Only a finished export still on disk can be deleted.",
                        effects=selectors.export_delete_effects(job=job))
    return _delete_then_back(request, run, lambda: services.export_delete(job=job, actor=request.user),
                             f"Deleted the merged export of {agent} (job #{job.pk}).")


def _confirm(request: TeamRequest, run: Run, *, kind: str, label: str, error: str | None, effects: list[str],
             button: str = "Delete") -> HttpResponse:
    back = reverse("storage") if request.GET.get("next") == reverse("storage") else run.get_absolute_url() + "#artifacts"
    return render(request, "confirm_delete.html", {"kind": kind, "object": label, "error": error, "effects": effects,
                                                   "back_url": back, "next": request.GET.get("next", ""), "button": button})


def _delete_then_back(request: TeamRequest, run: Run, delete: Callable[[], object], done: str) -> HttpResponse:
    """Run one storage deletion, say how it went, and go back to the storage page or the run's artifacts."""
    try:
        delete()
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, done)
    return redirect(request.POST.get("next") if request.POST.get("next") == reverse("storage") else run.get_absolute_url() + "#artifacts")


@require_GET
def run_file(request: TeamRequest, pk: int, name: str) -> HttpResponse:
    try:
        return run_file_download(request, run=team_object_or_404(request, Run, pk), name=name)
    except files.ArtifactMissing as exc:
        raise Http404(str(exc)) from None


@require_GET
def run_checkpoint_download(request: TeamRequest, pk: int, step: int, name: str) -> HttpResponse:
    run = team_object_or_404(request, Run, pk)
    try:
        return checkpoint_download(request, run=run, checkpoint=run.checkpoints.filter(step=step).first(), name=name)
    except files.ArtifactMissing as exc:
        raise Http404(str(exc)) from None


@require_GET
def run_merged_download(request: TeamRequest, pk: int, job_id: int) -> HttpResponse:
    run = team_object_or_404(request, Run, pk)
    job = get_object_or_404(Job, pk=job_id, run=run, kind=Job.Kind.MERGE)
    try:
        return merged_download(request, job=job)
    except files.ArtifactMissing as exc:
        raise Http404(str(exc)) from None
