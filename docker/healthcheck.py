"""Container health checks (stdlib only, so the slim image needs no curl).

    python docker/healthcheck.py web           GET http://127.0.0.1:8000/healthz answers 200
    python docker/healthcheck.py worker NODE   the Celery worker NODE (e.g. gpu0@%h) answers a ping,
                                               or is busy with a run whose heartbeat is recent

The web check sends a Host header taken from ALLOWED_HOSTS, so Django accepts the request
whatever host names the deployment allows. A solo-pool worker answers no ping while it runs a
task, so during a run the worker counts as healthy while its run's heartbeat (written every
training step) is younger than RUN_HEARTBEAT_MINUTES.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

APP_DIR = Path(__file__).resolve().parent.parent
"""The repository root (/app in the images): where `webapp` imports from."""


def allowed_host() -> str:
    hosts = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
    for host in hosts:
        if host != "*":
            return host.lstrip(".")  # ".example.com" allows example.com itself
    return "localhost"


WEB_URL = "http://127.0.0.1:8000/healthz"
RUN_HEARTBEAT_MINUTES = 60
"""Longest gap between two training steps (model loading and evaluation included) of a healthy run."""


def check_web(url: str = WEB_URL) -> int:
    request = urllib.request.Request(url, headers={"Host": allowed_host()})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return 0 if response.status == 200 else 1
    except OSError as exc:  # refused, timed out, or an HTTP error status (HTTPError is an OSError)
        print(f"web unhealthy: {exc}", file=sys.stderr)
        return 1


def check_worker(node: str) -> int:
    node = node.replace("%h", socket.gethostname())  # Celery expands %h the same way
    try:
        result = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "webapp", "inspect", "ping", "--destination", node, "--timeout", "10"],
            cwd=APP_DIR,
            capture_output=True,
            text=True,
            timeout=25,
            check=False,
        )
        if result.returncode == 0:
            return 0
        why = (result.stdout + result.stderr).strip()[-300:]
    except subprocess.TimeoutExpired:
        why = "celery inspect ping did not return in 25 s"
    try:
        if running_with_recent_heartbeat(node):
            return 0
    except Exception as exc:  # database unreachable, settings broken: unhealthy, say why
        why += f"; the database check failed: {type(exc).__name__}: {exc}"
    print(f"worker {node} unhealthy: no ping answer ({why}) and no run stepping", file=sys.stderr)
    return 1


def running_with_recent_heartbeat(node: str) -> bool:
    """Whether the database has a run of this worker that is running and stepped recently."""
    import datetime

    import django

    sys.path.insert(0, str(APP_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    django.setup()
    from django.utils import timezone

    from webapp.models import Run

    since = timezone.now() - datetime.timedelta(minutes=RUN_HEARTBEAT_MINUTES)
    return Run.objects.filter(status=Run.Status.RUNNING, worker=node, heartbeat__gte=since).exists()


if __name__ == "__main__":
    if sys.argv[1:] == ["web"]:
        sys.exit(check_web())
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        sys.exit(check_worker(sys.argv[2]))
    sys.exit(f"usage: {sys.argv[0]} web | worker NODE")
