"""Container health checks (stdlib only, so the slim image needs no curl).

    python docker/healthcheck.py web           GET http://127.0.0.1:8000/healthz answers 200
    python docker/healthcheck.py worker NODE   the Celery worker NODE (e.g. gpu0@%h) answers a ping

The web check sends a Host header taken from ALLOWED_HOSTS, so Django accepts the request
whatever host names the deployment allows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request


def allowed_host() -> str:
    hosts = [h.strip() for h in os.environ.get("ALLOWED_HOSTS", "").split(",") if h.strip()]
    for host in hosts:
        if host != "*":
            return host.lstrip(".")  # ".example.com" allows example.com itself
    return "localhost"


WEB_URL = "http://127.0.0.1:8000/healthz"


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
            ["celery", "-A", "webapp", "inspect", "ping", "--destination", node, "--timeout", "10"],
            capture_output=True,
            text=True,
            timeout=25,
            check=False,
        )
    except subprocess.TimeoutExpired:
        print(f"worker {node} unhealthy: no answer in 25 s", file=sys.stderr)
        return 1
    if result.returncode != 0:
        print(f"worker {node} unhealthy: {result.stdout}{result.stderr}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    if sys.argv[1:] == ["web"]:
        sys.exit(check_web())
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        sys.exit(check_worker(sys.argv[2]))
    sys.exit(f"usage: {sys.argv[0]} web | worker NODE")
