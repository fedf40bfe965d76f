"""The fleet of workers: each worker process registers itself, beats (memory, current run) and
sweeps for lost runs and jobs; the web process sweeps too (`Sweeper`, started in webapp/asgi.py),
so a run never stays `running` while the web is up, even when its only worker is gone for good.
A worker that comes back under the same name fails what its earlier process left running.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from webapp.jobs.services import job_fail_lost, job_sweep_lost
from webapp.models import Worker
from webapp.runs.queue import run_sweep_lost

log = logging.getLogger(__name__)


# == workers ==========================================================================================


def worker_started(
    *, hostname: str, queues: list[str], pid: int, sandbox: dict[str, Any] | None = None,
    plugin_problems: dict[str, str] | None = None,
) -> int:
    """A worker process came up under `hostname`: register it with what its host provides (the
    sandbox layers, `agents.sandbox.capabilities`, and the operator's plugins that failed to load),
    and fail the runs an earlier process under the same name left running (it died; this one is
    not running them). Returns how many runs it failed."""
    from webapp.runs.services import run_fail_lost

    now = timezone.now()
    Worker.objects.update_or_create(
        hostname=hostname[:200],
        defaults={"pid": pid, "queues": ",".join(queues)[:200], "started": now, "last_seen": now, "stopped": None, "run": None,
                  "sandbox": sandbox or {}, "plugin_problems": plugin_problems or {}},
    )
    job_fail_lost(worker=hostname)
    return run_fail_lost(worker=hostname)


def worker_beat(*, hostname: str, rss_bytes: int, gpu: dict[str, Any]) -> None:
    """The worker is alive: refresh its row (memory; its run is set by the claim)."""
    updated = Worker.objects.filter(hostname=hostname[:200]).update(
        last_seen=timezone.now(), stopped=None, rss_bytes=rss_bytes, gpu=gpu, pid=os.getpid(),
    )
    if not updated:  # the row was removed (admin, a flushed test database): write it again
        Worker.objects.update_or_create(hostname=hostname[:200], defaults={"pid": os.getpid(), "rss_bytes": rss_bytes, "gpu": gpu})


def worker_stopped(*, hostname: str) -> None:
    Worker.objects.filter(hostname=hostname[:200]).update(stopped=timezone.now(), run=None)


def worker_list() -> list[Worker]:
    """Every worker seen in the last day, online ones first."""
    since = timezone.now() - timedelta(days=1)
    workers = list(Worker.objects.filter(last_seen__gte=since).select_related("run"))
    now = timezone.now()
    return sorted(workers, key=lambda w: (not w.is_online(now), w.hostname))


def process_memory() -> tuple[int, dict[str, Any]]:
    """(resident bytes of this process, GPU memory if this process already uses CUDA). Never
    initialises CUDA itself: a worker that has not run anything on the GPU reports none."""
    import psutil

    rss = int(psutil.Process().memory_info().rss)
    gpu: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                device = torch.cuda.current_device()
                free, total = torch.cuda.mem_get_info(device)
                gpu = {
                    "name": torch.cuda.get_device_name(device),
                    "allocated": int(torch.cuda.memory_allocated(device)),
                    "reserved": int(torch.cuda.memory_reserved(device)),
                    "used": int(total - free),
                    "total": int(total),
                }
        except Exception as exc:  # noqa: BLE001 (a broken driver must not stop the heartbeat)
            gpu = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    return rss, gpu


class Sweeper(threading.Thread):
    """A background thread that sweeps for lost runs every TROUPE_HEARTBEAT_SECONDS. The web
    process runs one (webapp/asgi.py), so a deployment whose only worker died still fails its run;
    every worker runs a `WorkerBeat`, which sweeps too."""

    def __init__(self, *, name: str = "troupe-sweeper"):
        super().__init__(name=name, daemon=True)
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while True:
                try:
                    self.tick()
                except Exception as exc:  # noqa: BLE001 (database down: keep going, it may come back)
                    log.warning("%s: %s", self.name, exc)
                    connection.close()  # reconnect at the next tick
                if self.halt.wait(settings.TROUPE_HEARTBEAT_SECONDS):
                    return
        finally:
            connection.close()

    def tick(self) -> None:
        run_sweep_lost()
        job_sweep_lost()

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


class WorkerBeat(Sweeper):
    """The worker process's background thread: it writes the worker's row (memory) and sweeps."""

    def __init__(self, *, hostname: str):
        super().__init__(name="troupe-worker-beat")
        self.hostname = hostname

    def tick(self) -> None:
        rss, gpu = process_memory()
        worker_beat(hostname=self.hostname, rss_bytes=rss, gpu=gpu)
        run_sweep_lost()
        job_sweep_lost()
