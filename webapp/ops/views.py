"""Operators' pages: `/healthz`, the workers and the team's storage."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from webapp.artifacts import selectors as storage
from webapp.jobs import selectors as job_selectors
from webapp.models import Job
from webapp.ops import health, workers
from webapp.runs import queue
from webapp.teams.access import TeamRequest


@login_not_required
@never_cache
@require_GET
def healthz(request: TeamRequest) -> JsonResponse:
    """Database, Redis and workers as JSON: 200 when the web can serve, else 503."""
    healthy, body = health.health_report(require_workers=request.GET.get("require") == "workers")
    return JsonResponse(body, status=200 if healthy else 503)


@login_not_required
@require_GET
def favicon(request: TeamRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for on pages that name no icon: the static one."""
    return redirect(static("favicon.svg"), permanent=True)


@require_GET
def worker_list(request: TeamRequest) -> HttpResponse:
    """Every worker seen lately: online or not, its run (named only for the viewer's team), memory."""
    queued = queue.run_queue()
    template = "ops/workers.html#table" if request.htmx else "ops/workers.html"
    return render(request, template, {
        "workers": workers.worker_list(),
        "queued_total": queued.count(),
        "queued_team": queued.filter(team=request.team).count(),
        "jobs_queued": job_selectors.job_lane().count(),
        "jobs_running": {job.worker: job for job in Job.objects.filter(status=Job.Status.RUNNING).exclude(worker="")},
        "lost_seconds": settings.TROUPE_WORKER_LOST_SECONDS,
    })


@require_GET
def storage_page(request: TeamRequest) -> HttpResponse:
    """What the team keeps on disk (runs, exports, uploads) and the shared model cache."""
    return render(request, "ops/storage.html", {"report": storage.storage_report(team=request.team)})
