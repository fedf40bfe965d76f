"""The Celery app. Workers: `celery -A webapp worker -Q gpu -P solo` (one run at a time).

Configuration lives in settings (`CELERY_*`, see STACK-NOTES): late acks, prefetch 1, a broker
visibility timeout above the longest run, the run task routed to the `gpu` queue. The worker
process never imports torch before a task starts, so no CUDA context exists before a fork.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# Celery warns at every start of a worker running as root (a laptop's or a container's user); the
# worker's own start line says which user it runs as and what the sandbox lacks (_host_report).
warnings.filterwarnings("ignore", category=SecurityWarning)

app = Celery("webapp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["webapp.runs", "webapp.jobs"])  # their tasks.py


@worker_init.connect
def _private_files(**kwargs: Any) -> None:
    """A worker writes run outputs, checkpoints and exports for its user alone (umask 077, whatever
    the shell's), and closes what an older install left readable in the data dir."""
    from django.conf import settings

    from webapp.core.private import data_dir_tighten, umask_private

    umask_private()
    data_dir_tighten(settings.TROUPE_DATA_DIR, deep=True)


@worker_shutting_down.connect
def _stop_runs_on_shutdown(sig: str, how: str, exitcode: int, **kwargs: Any) -> None:
    """Ctrl-C / SIGTERM: ask the run in this process to stop at its next step, so the worker
    exits after recording it as cancelled. Runs inside a signal handler: only sets a flag."""
    from webapp.runs.sink import WORKER_SHUTTING_DOWN

    WORKER_SHUTTING_DOWN.set()


@worker_ready.connect
def _quiet_shutdown(sender: Any, **kwargs: Any) -> None:
    """The worker `manage.py troupe` starts (TROUPE_QUIET_CONSOLE=1) stops without Celery's "worker:
    Warm shutdown (MainProcess)" line on the console: its SIGTERM handler, installed at the start,
    is installed again without the line; the shutdown itself is the same warm one."""
    if os.environ.get("TROUPE_QUIET_CONSOLE") != "1":
        return
    from celery.apps.worker import install_worker_term_handler

    install_worker_term_handler(getattr(sender, "controller", None), verbose=False)


_beat: Any = None


@worker_ready.connect
def _start_worker_beat(sender: Any, **kwargs: Any) -> None:
    """Register this worker, fail the runs a previous process of the same name left running, and
    start its heartbeat thread (memory, lost-run sweep: see webapp.ops.workers). The signal can come
    again after a broker reconnection: only the first one starts anything."""
    global _beat
    if _beat is not None:
        return
    from webapp.ops import workers

    hostname = getattr(sender, "hostname", "") or ""
    queues = [q.name for q in getattr(getattr(sender, "task_consumer", None), "queues", [])]
    sandbox, problems = _host_report(hostname)
    try:
        workers.worker_started(hostname=hostname, queues=queues, pid=os.getpid(), sandbox=sandbox, plugin_problems=problems)
    except Exception:  # the database is not up yet: the heartbeat thread writes the row when it is
        logging.getLogger(__name__).exception("worker %s: could not register", hostname)
    _beat = workers.WorkerBeat(hostname=hostname)
    _beat.start()


def _host_report(hostname: str) -> tuple[dict[str, Any], dict[str, str]]:
    """What this host provides, said once on the worker's start line (and stored for /workers/):
    the sandbox layers it lacks, and the registered plugins that failed to load."""
    from agents import plugins, sandbox

    log = logging.getLogger(__name__)
    try:
        caps: dict[str, Any] = dict(sandbox.capabilities())
    except Exception as exc:  # noqa: BLE001 (the probe must not keep a worker from starting)
        caps = {"missing": "unknown", "error": f"{type(exc).__name__}: {exc}"}
    if caps.get("error"):
        log.warning("worker %s: the sandbox probe failed: %s", hostname, caps["error"])
    elif caps.get("missing"):
        log.warning("worker %s: the sandbox lacks on this host: %s (running as %s; see docs/security.md)",
                    hostname, caps["missing"], caps.get("user"))
    else:
        log.info("worker %s: the sandbox has every layer (running as %s)", hostname, caps.get("user"))
    problems = plugins.problems()
    for what, why in problems.items():
        log.warning("worker %s: plugin %s did not load: %s", hostname, what, why)
    return caps, problems


@worker_shutdown.connect
def _stop_worker_beat(sender: Any, **kwargs: Any) -> None:
    if _beat is None:
        return
    from webapp.ops import workers

    _beat.stop()
    workers.worker_stopped(hostname=_beat.hostname)
