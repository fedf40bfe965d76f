"""Production settings: with DEBUG off and a SECRET_KEY in the environment, `manage.py check
--deploy` passes with no warning; HTTPS behaviour is secure by default and env-controlled.
Run in a plain process (outside pytest no test knob applies)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SHOW = ("SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS", "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_PROXY_SSL_HEADER", "CSRF_TRUSTED_ORIGINS", "SECURE_REDIRECT_EXEMPT", "DEBUG", "SESSION_COOKIE_HTTPONLY",
        "X_FRAME_OPTIONS", "SECURE_CONTENT_TYPE_NOSNIFF")


def production_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SECURE_", "CSRF_", "SESSION_")) and k not in (
        "DEBUG", "SECRET_KEY", "DATABASE_URL", "REDIS_URL", "TROUPE_HTTPS", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")}
    env.update(DEBUG="0", SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="troupe.example.org",
               TROUPE_DATA_DIR=str(tmp_path / "data"), **extra)
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def settings_in(env: dict[str, str]) -> dict:
    code = ("import json, django; from django.conf import settings; "
            f"print(json.dumps({{k: getattr(settings, k) for k in {SHOW!r}}}))")
    proc = run(["-c", "import os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings'); " + code], env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_check_deploy_passes_without_a_warning(tmp_path):
    proc = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], production_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout


def test_check_deploy_fails_with_an_insecure_setup(tmp_path):
    proc = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], production_env(tmp_path, TROUPE_HTTPS="0"))
    assert proc.returncode != 0
    assert "security.W008" in proc.stderr + proc.stdout  # the SSL redirect is off


def test_https_is_secure_by_default_with_debug_off(tmp_path):
    s = settings_in(production_env(tmp_path))
    assert s["SECURE_SSL_REDIRECT"] and s["SESSION_COOKIE_SECURE"] and s["CSRF_COOKIE_SECURE"]
    assert s["SECURE_HSTS_SECONDS"] >= 31536000 and s["SECURE_HSTS_INCLUDE_SUBDOMAINS"]
    assert s["SECURE_REDIRECT_EXEMPT"] == ["^healthz$"]  # container health checks speak plain HTTP
    assert s["SECURE_PROXY_SSL_HEADER"] is None and s["CSRF_TRUSTED_ORIGINS"] == []
    assert s["X_FRAME_OPTIONS"] == "DENY" and s["SECURE_CONTENT_TYPE_NOSNIFF"] and s["SESSION_COOKIE_HTTPONLY"]


def test_https_settings_come_from_the_environment(tmp_path):
    s = settings_in(production_env(tmp_path, SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto", SECURE_HSTS_SECONDS="60",
                                   CSRF_TRUSTED_ORIGINS="https://troupe.example.org, https://gpu.example.org:8443"))
    assert s["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert s["SECURE_HSTS_SECONDS"] == 60
    assert s["CSRF_TRUSTED_ORIGINS"] == ["https://troupe.example.org", "https://gpu.example.org:8443"]
    plain = settings_in(production_env(tmp_path, TROUPE_HTTPS="false"))
    assert not plain["SECURE_SSL_REDIRECT"] and not plain["SESSION_COOKIE_SECURE"] and plain["SECURE_HSTS_SECONDS"] == 0


@pytest.mark.parametrize(("name", "value"), [("CSRF_TRUSTED_ORIGINS", "troupe.example.org"), ("TROUPE_HTTPS", "maybe"),
                                             ("SECURE_HSTS_SECONDS", "a year")])
def test_a_bad_value_stops_startup_naming_the_variable(tmp_path, name, value):
    proc = run(["-c", "import webapp.settings"], production_env(tmp_path, **{name: value}))
    assert proc.returncode != 0 and name in proc.stderr


def test_debug_stays_off_unless_asked(tmp_path):
    env = production_env(tmp_path)
    env.pop("DEBUG")
    assert settings_in(env)["DEBUG"] is False


def shipped_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """What `make run` starts with on a fresh laptop: no DEBUG, no SECRET_KEY, the data dir only."""
    env = production_env(tmp_path, **extra)
    for name in ("DEBUG", "SECRET_KEY", "ALLOWED_HOSTS"):
        if name not in extra:
            env.pop(name)
    return env


SERVE = ("import os, json, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'webapp.settings'); django.setup(); "
         "from django.test import Client; c = Client(HTTP_HOST='127.0.0.1'); "
         "out = {p: [r.status_code, r.get('Location', ''), r.get('Content-Type', '')] for p, r in "
         "((p, c.get(p)) for p in ('/static/css/troupe.css', '/static/favicon.svg', '/favicon.ico', '/login/'))}; "
         "print(json.dumps(out))")


def test_the_shipped_default_serves_static_files_without_debug_and_plain_http_only_when_asked(tmp_path):
    # what `manage.py troupe` on 127.0.0.1 gives its web server: TROUPE_HTTPS=0 (see test_troupe_local_defaults)
    proc = run(["-c", SERVE], shipped_env(tmp_path, TROUPE_HTTPS="0"))
    assert proc.returncode == 0, proc.stderr
    served = json.loads(proc.stdout)
    assert served["/static/css/troupe.css"][0] == 200 and served["/static/css/troupe.css"][2].startswith("text/css")  # WhiteNoise
    assert served["/static/favicon.svg"][0] == 200
    assert served["/favicon.ico"][:2] == [301, "/static/favicon.svg"]
    assert served["/login/"][0] == 200  # plain HTTP, no redirect
    # anywhere else HTTPS is the default: the same request is sent to https://
    secure = json.loads(run(["-c", SERVE], shipped_env(tmp_path)).stdout)
    assert secure["/login/"][:2] == [301, "https://127.0.0.1/login/"]
