"""Reads for jobs: their lane (the interactive lane, ahead of every queued run: `webapp.core.enqueue`),
where a queued job stands in it and what it waits for, and the team's active jobs for the dashboard."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Q, QuerySet
from django.urls import reverse
from django.utils import timezone

from webapp.core.enqueue import GPU_QUEUE
from webapp.models import Job, Run, Team, Worker


def team_jobs(*, team: Team, kind: str | None = None, status: str | None = None) -> QuerySet[Job]:
    """The team's jobs (of a kind, in a status, if given), newest first."""
    rows = Job.objects.filter(team=team).select_related("owner").order_by("-created", "-pk")
    rows = rows.filter(kind=kind) if kind else rows
    return rows.filter(status=status) if status else rows


def job_lane() -> QuerySet[Job]:
    """Every team's queued jobs, in the order workers take them (oldest first)."""
    return Job.objects.filter(status=Job.Status.QUEUED).order_by("created", "id")


def job_lane_position(*, job: Job) -> int | None:
    """1-based place of a queued job in the jobs lane (shared by every team); None once it left it."""
    if job.status != Job.Status.QUEUED:
        return None
    ahead = job_lane().filter(Q(created__lt=job.created) | Q(created=job.created, id__lt=job.pk)).count()
    return ahead + 1


def job_url(job: Job) -> str:
    """The page that shows a job: the playground's transcript, or the run page's part it fills."""
    if job.kind == Job.Kind.PLAYGROUND:
        return reverse("playground_job", args=[job.pk])
    if job.run_id is None:
        return ""
    anchor = "#artifacts" if job.kind == Job.Kind.MERGE else "#held-out"
    return reverse("run_detail", args=[job.run_id]) + anchor


def team_active_jobs(*, team: Team) -> list[Job]:
    """The team's queued and running jobs, oldest first, each with `lane_position` and `url` set."""
    jobs = list(Job.objects.filter(team=team, status__in=Job.ACTIVE).select_related("owner", "run").order_by("created", "id"))
    lane = list(job_lane().values_list("pk", flat=True)[:1000])
    for job in jobs:
        job.lane_position = lane.index(job.pk) + 1 if job.pk in lane else None  # type: ignore[attr-defined]
        job.url = job_url(job)  # type: ignore[attr-defined]
    return jobs


def job_waiting_for(*, job: Job, team: Team | None = None) -> str:
    """What a queued job waits for, in one sentence: its place in the jobs lane, and whether a worker
    is free, busy with a run (which it finishes first) or missing. Empty once the job left the lane."""
    position = job_lane_position(job=job)
    if position is None:
        return ""
    place = "next in the jobs lane" if position == 1 else f"number {position} in the jobs lane ({position - 1} ahead)"
    queued_runs = Run.objects.filter(status=Run.Status.QUEUED).count()
    before = f"; it goes before the {queued_runs} queued run{'s' if queued_runs != 1 else ''}" if queued_runs else ""
    since = timezone.now() - timedelta(seconds=settings.TROUPE_WORKER_LOST_SECONDS)
    serving = [w for w in Worker.objects.filter(stopped__isnull=True, last_seen__gte=since).select_related("run")
               if GPU_QUEUE in w.queue_names()]
    if not serving:
        return (f"Waiting for a worker: none is online for the {GPU_QUEUE} queue ({place}). Start one with "
                f"`python manage.py troupe` on one machine, or `celery -A webapp worker -Q {GPU_QUEUE} -P solo`.")
    busy_jobs = set(Job.objects.filter(status=Job.Status.RUNNING).values_list("worker", flat=True))
    free = [w for w in serving if not w.run_id and w.hostname not in busy_jobs]
    if free:
        return f"Waiting for a free worker to take it: {place}{before}."
    runs = [w.run for w in serving if w.run is not None]
    if runs:
        mine = [r for r in runs if team is not None and r.team_id == team.pk]
        shown = ", ".join(f"run #{r.pk} at step {r.step}/{r.total_steps}" for r in mine[:3]) or "another team's run"
        return (f"Waiting for a worker to finish its current run ({shown}): {place}{before}. "
                f"A worker finishes the run it has before it takes a job.")
    return f"Waiting for a worker to finish its current job: {place}{before}."
