"""The run queue, its claims and heartbeats, and the sweep for lost runs.

Services like the rest (keyword-only, `<entity>_<action>`); the worker side lives in
`webapp.ops.workers`.

The queue. Every queued run sends one message to Celery's `gpu` queue, but a message does not
name the run it executes: a worker that takes a message claims the *first queued run in queue
order* (`Run.QUEUE_ORDER`: higher `priority` first, then smaller `queue_order`), with an atomic
conditional update, so several workers never claim the same run. Messages are tokens, at least
one per queued run: a message whose run was cancelled, or already taken by another token, finds
nothing (or the next run) and returns. So reordering the queue in the database reorders what
workers start, whatever order Celery delivers messages in, and a message redelivered by the
broker never executes a run twice (the run is no longer queued).

Heartbeats. While a run executes, a thread in the same process writes `Run.heartbeat` every
`TROUPE_HEARTBEAT_SECONDS` (model loading and long steps included). Each worker process also
runs a `WorkerBeat` thread (started by `webapp.celery` when the worker is ready) that writes its
`Worker` row (memory, current run) and sweeps for lost runs.

Lost runs. `run_sweep_lost` marks failed ("worker lost") every running run whose heartbeat is
older than `TROUPE_WORKER_LOST_SECONDS`: its process was killed (SIGKILL, OOM killer, power) or
frozen. It is one conditional UPDATE per run, safe to run from many places at once. A failed run
resumes from its last checkpoint (`webapp.runs.services.run_resume`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.db.models import Count, Q
from django.utils import timezone

from webapp.core import paths
from webapp.models import LogLine, Membership, Run, Worker
from webapp.runs.publish import publish

log = logging.getLogger(__name__)


LOST_MESSAGE = (
    "worker lost: {worker} stopped sending heartbeats during the run (last heard {age:.0f} s ago; the limit is "
    "{limit} s). Its process was killed or froze. Resume the run from its last checkpoint."
)


# == the queue ======================================================================================


def run_queue() -> Any:
    """Every queued run, in the order workers will take them."""
    return Run.objects.filter(status=Run.Status.QUEUED).order_by(*Run.QUEUE_ORDER)


def run_queue_positions() -> dict[int, int]:
    """Queued run id -> its 1-based place in the shared queue (all teams' runs count)."""
    return {pk: i for i, pk in enumerate(run_queue().values_list("pk", flat=True), start=1)}


def run_queue_position(*, run: Run) -> int | None:
    """The run's place in the shared queue (1 = next to start), or None when it is not queued."""
    if run.status != Run.Status.QUEUED:
        return None
    ahead = run_queue().filter(
        Q(priority__gt=run.priority)
        | Q(priority=run.priority, queue_order__lt=run.queue_order)
        | Q(priority=run.priority, queue_order=run.queue_order, pk__lt=run.pk)
    )
    return ahead.count() + 1


def run_waiting_for(*, run: Run) -> str:
    """What a queued run waits for, in one sentence (its log box says it until the first line):
    its place in the shared queue and the workers that serve its queue, or that none does."""
    position = run_queue_position(run=run)
    if position is None:
        return ""
    queue_name = run.queue_name
    since = timezone.now() - timedelta(seconds=settings.TROUPE_WORKER_LOST_SECONDS)
    serving = [w for w in Worker.objects.filter(stopped__isnull=True, last_seen__gte=since) if queue_name in w.queue_names()]
    ahead = position - 1
    queued = f"{ahead} queued run{'s' if ahead != 1 else ''} ahead of it" if ahead else "it is next in the queue"
    if not serving:
        return (f"Waiting for a worker: none is online for the {queue_name} queue ({queued}). Start one with "
                f"`python manage.py troupe` on one machine, or `celery -A webapp worker -Q {queue_name} -P solo`.")
    busy = sum(1 for w in serving if w.run_id)
    workers = f"{len(serving)} worker{'s' if len(serving) != 1 else ''} online for the {queue_name} queue, {busy} busy"
    if busy == len(serving):
        return f"Waiting for a worker to finish its run: {workers}; {queued}."
    return f"Waiting for a worker to take it: {workers}; {queued}."


def run_can_reorder(*, run: Run, user: User) -> bool:
    """Site staff and the run's team admins may move its team's queued runs up and down."""
    if user.is_staff:
        return True
    return Membership.objects.filter(team_id=run.team_id, user=user, role=Membership.Role.ADMIN).exists()


@transaction.atomic
def run_queue_move(*, run: Run, user: User, direction: str) -> Run:
    """Swap a queued run's place with the previous (`up`) or next (`down`) queued run of the same
    team. Other teams' runs keep their places: a team reorders its own turns, it never jumps
    the shared queue (site staff do that with `priority` in the admin)."""
    if direction not in ("up", "down"):
        raise ValueError(f"direction must be up or down, not {direction!r}")
    if not run_can_reorder(run=run, user=user):
        raise PermissionDenied("Only team admins and staff reorder the queue.")
    mine = list(run_queue().filter(team_id=run.team_id).select_for_update())
    ids = [r.pk for r in mine]
    if run.pk not in ids:
        return run  # started or cancelled meanwhile: nothing to move
    i = ids.index(run.pk)
    j = i - 1 if direction == "up" else i + 1
    if not 0 <= j < len(mine):
        return mine[i]
    me, other = mine[i], mine[j]
    if (me.priority, me.queue_order) == (other.priority, other.queue_order):
        me.queue_order = other.queue_order + (-1 if direction == "up" else 1)  # equal keys: the id decides; step past it
    else:
        me.priority, other.priority = other.priority, me.priority
        me.queue_order, other.queue_order = other.queue_order, me.queue_order
    Run.objects.filter(pk=me.pk, status=Run.Status.QUEUED).update(priority=me.priority, queue_order=me.queue_order)
    Run.objects.filter(pk=other.pk, status=Run.Status.QUEUED).update(priority=other.priority, queue_order=other.queue_order)
    return me


def run_claim(*, run_id: int, worker: str) -> Run | None:
    """Claim one queued run for `worker` (atomic: one conditional UPDATE); None if it is not queued."""
    now = timezone.now()
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).update(
        status=Run.Status.RUNNING, started=now, heartbeat=now, worker=worker[:200], out_dir=str(paths.run_dir(run_id)),
    )
    if not claimed:
        return None
    if worker:
        Worker.objects.filter(hostname=worker).update(run_id=run_id, last_seen=now)
    return Run.objects.get(pk=run_id)


def experiment_capped_teams() -> list[int]:
    """Teams whose running experiment trials reach TROUPE_EXPERIMENT_CONCURRENCY: their queued
    trials are held (skipped by the claims) until one of the running trials ends."""
    running = (Run.objects.filter(status=Run.Status.RUNNING, experiment__isnull=False).values("team_id")
               .annotate(n=Count("id")).filter(n__gte=settings.TROUPE_EXPERIMENT_CONCURRENCY))
    return [row["team_id"] for row in running]


def run_is_held(*, run: Run, capped: list[int] | None = None) -> bool:
    """Whether a queued run is an experiment trial held back by its team's cap on running trials."""
    if run.status != Run.Status.QUEUED or run.experiment_id is None:
        return False
    return run.team_id in (experiment_capped_teams() if capped is None else capped)


def run_claim_next(*, worker: str, gpus: int = 1, hosts: int = 1) -> Run | None:
    """Claim the first queued run in queue order among the runs needing `gpus` GPUs, or for
    `hosts > 1` among the runs on several hosts (the runs whose messages go to the queue this
    message came from, `Run.queue_name`), passing over experiment trials of a
    team at its cap on running trials (`experiment_capped_teams`); None when there is none. Each
    failed attempt means another worker claimed that run, so the loop always makes progress."""
    while True:
        held = Q(experiment__isnull=False, team_id__in=experiment_capped_teams())
        candidates = run_queue().filter(hosts__gt=1) if hosts > 1 else run_queue().filter(gpus=gpus, hosts=1)
        candidate = candidates.exclude(held).values_list("pk", flat=True).first()
        if candidate is None:
            return None
        run = run_claim(run_id=candidate, worker=worker)
        if run is not None:
            return run


# == heartbeats =======================================================================================


@contextmanager
def run_heartbeat(*, run_id: int, worker: str = "") -> Iterator[None]:
    """While the block runs, a thread writes the run's heartbeat every TROUPE_HEARTBEAT_SECONDS,
    so a long model load or a slow step never looks like a dead worker; if the process dies,
    so does the thread, and the heartbeat goes stale. The first beat comes after one interval."""
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(settings.TROUPE_HEARTBEAT_SECONDS):
                try:
                    now = timezone.now()
                    Run.objects.filter(pk=run_id, status=Run.Status.RUNNING).update(heartbeat=now)
                except Exception as exc:  # noqa: BLE001 (a database blip: try again next beat)
                    log.warning("run %s: heartbeat not written (%s)", run_id, exc)
                    connection.close()  # reconnect at the next beat
        finally:
            connection.close()

    thread = threading.Thread(target=beat, name=f"run-{run_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        if worker:
            Worker.objects.filter(hostname=worker, run_id=run_id).update(run=None)


def run_sweep_lost(*, now: Any = None) -> list[int]:
    """Mark failed ("worker lost") every running run whose heartbeat is older than
    TROUPE_WORKER_LOST_SECONDS. Each run is one conditional UPDATE (still running, still stale),
    so concurrent sweepers and a late heartbeat never conflict. Returns the ids marked."""
    now = now or timezone.now()
    limit = settings.TROUPE_WORKER_LOST_SECONDS
    cutoff = now - timedelta(seconds=limit)
    stale = Q(heartbeat__lt=cutoff) | Q(heartbeat__isnull=True, started__lt=cutoff)
    marked = []
    for run in Run.objects.filter(stale, status=Run.Status.RUNNING).only("pk", "worker", "heartbeat", "started"):
        last = run.heartbeat or run.started or cutoff
        message = LOST_MESSAGE.format(worker=run.worker or "its worker", age=(now - last).total_seconds(), limit=limit)
        done = Run.objects.filter(stale, pk=run.pk, status=Run.Status.RUNNING).update(
            status=Run.Status.FAILED, finished=now, error_message=message,
        )
        if done:
            marked.append(run.pk)
            LogLine.objects.create(run_id=run.pk, level="error", message=message)
            Worker.objects.filter(run_id=run.pk).update(run=None)
            log.warning("run %s: %s", run.pk, message)
            publish(run_id=run.pk, event="finished", payload={"status": Run.Status.FAILED, "error": message})
    return marked
