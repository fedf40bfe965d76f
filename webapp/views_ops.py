"""Operations pages: health (no login), workers, and the run queue's order and positions."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.templatetags.static import static
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from webapp import health, lifecycle, storage
from webapp.access import TeamRequest, team_object_or_404
from webapp.models import Run


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
    queued = lifecycle.run_queue()
    template = "workers.html#table" if request.htmx else "workers.html"
    return render(request, template, {
        "workers": lifecycle.worker_list(),
        "queued_total": queued.count(),
        "queued_team": queued.filter(team=request.team).count(),
        "lost_seconds": settings.TROUPE_WORKER_LOST_SECONDS,
    })


@require_GET
def storage_page(request: TeamRequest) -> HttpResponse:
    """What the team keeps on disk (runs, exports, uploads) and the shared model cache."""
    return render(request, "storage.html", {"report": storage.storage_report(team=request.team)})


@require_POST
def run_queue_move(request: TeamRequest, pk: int, direction: str) -> HttpResponse:
    """Move a queued run up or down among its team's queued runs (team admins and staff)."""
    run = team_object_or_404(request, Run, pk)
    lifecycle.run_queue_move(run=run, user=request.user, direction=direction)
    back = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return redirect(back)
    return redirect(run)


@require_GET
def run_queue_position(request: TeamRequest, pk: int) -> HttpResponse:
    """The run page's queue line (htmx polls it while the run waits)."""
    run = team_object_or_404(request, Run, pk)
    return render(request, "runs/detail.html#queue", _queue_context(request, run))


def _queue_context(request: TeamRequest, run: Run) -> dict[str, object]:
    return {
        "run": run,
        "queue_position": lifecycle.run_queue_position(run=run),
        "can_reorder": run.status == Run.Status.QUEUED and lifecycle.run_can_reorder(run=run, user=request.user),
    }
