"""Is Troupe up? The checks behind `/healthz` (load balancers, docker/healthcheck.py, compose).

The answer is unhealthy (503) when the database or Redis does not answer: the web cannot serve
pages or stream without them. Workers are reported but do not make the web unhealthy (a load
balancer should not take the web down because the GPU hosts are busy or restarting), unless the
caller asks for them (`/healthz?require=workers`, for a monitor that pages someone). The answer
carries no host names, addresses or error texts: `/healthz` needs no login.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from webapp.models import Worker

TIMEOUT_S = 2.0
"""How long each check may take."""


def health_report(*, require_workers: bool = False) -> tuple[bool, dict[str, Any]]:
    """(healthy, the JSON body)."""
    database = _timed(_check_database)
    redis = _timed(_check_redis)
    workers = _timed(_check_workers) if database["ok"] else {"ok": False, "error": "database unavailable"}
    healthy = database["ok"] and redis["ok"] and (workers["ok"] or not require_workers)
    return healthy, {
        "status": "ok" if healthy else "unavailable",
        "checks": {"database": database, "redis": redis, "workers": workers},
        "time": timezone.now().isoformat(),
    }


def _timed(check: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        result = {"ok": True, **check()}
    except Exception as exc:  # noqa: BLE001 (any failure of a dependency is "not ok")
        result = {"ok": False, "error": type(exc).__name__}
    result["ms"] = round(1000 * (time.perf_counter() - start), 1)
    return result


def _check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {}


def _check_redis() -> dict[str, Any]:
    import redis

    url = settings.REDIS_URL or f"unix://{settings.EMBEDDED_REDIS_SOCKET}"
    client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
    try:
        if not client.ping():
            raise ConnectionError("no PONG")
    finally:
        client.close()
    return {}


def _check_workers() -> dict[str, Any]:
    now = timezone.now()
    online = [w for w in Worker.objects.filter(stopped__isnull=True) if w.is_online(now)]
    busy = sum(1 for w in online if w.run_id is not None)
    if not online:
        return {"ok": False, "online": 0, "busy": 0}
    return {"online": len(online), "busy": busy}
