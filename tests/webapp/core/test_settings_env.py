"""Settings read the environment and fail loudly, naming the variable."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parents[3] / "webapp" / "settings.py"


def load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **env: str) -> dict:
    for key in ("DATABASE_URL", "REDIS_URL", "DEBUG", "ALLOWED_HOSTS", "SECRET_KEY", "TROUPE_UPLOAD_MAX_BYTES"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TROUPE_DATA_DIR", str(tmp_path / "data"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return runpy.run_path(str(SETTINGS))


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://root@localhost/troupe"),
        ("DATABASE_URL", "postgres://"),
        ("REDIS_URL", "localhost:6379"),
        ("ALLOWED_HOSTS", " , "),
        ("TROUPE_UPLOAD_MAX_BYTES", "ten"),
        ("TROUPE_DATA_DIR", "relative/dir"),
    ],
)
def test_it_names_the_variable_with_a_bad_value(monkeypatch, tmp_path, name, value):
    with pytest.raises(ImproperlyConfigured, match=name):
        load(monkeypatch, tmp_path, **{name: value})


def test_it_defaults_to_sqlite_in_the_data_dir(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path)
    assert s["DATABASES"]["default"]["NAME"] == str(tmp_path / "data" / "troupe.sqlite3")
    assert (tmp_path / "data").is_dir()


def test_it_reads_postgres_and_redis_urls(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path, DATABASE_URL="postgres://u:p@db:5432/troupe", REDIS_URL="redis://cache:6379/1",
             ALLOWED_HOSTS="troupe.example.org, localhost", DEBUG="on")
    assert s["DATABASES"]["default"]["ENGINE"] == "django.db.backends.postgresql"
    assert s["DATABASES"]["default"]["NAME"] == "troupe"
    assert s["ALLOWED_HOSTS"] == ["troupe.example.org", "localhost"]
    assert s["DEBUG"] is True
    assert s["REDIS_URL"] == "redis://cache:6379/1"


def test_it_uses_the_embedded_redis_socket_without_redis_url(monkeypatch, tmp_path):
    s = load(monkeypatch, tmp_path)
    assert s["REDIS_URL"] is None
    assert str(s["EMBEDDED_REDIS_SOCKET"]).endswith(".sock")


def test_it_generates_a_secret_key_once_into_the_data_dir(tmp_path):
    # Outside pytest (plain processes), where no test knob supplies a key: the shipped default.
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    env.update(TROUPE_DATA_DIR=str(tmp_path))

    def key() -> str:
        proc = subprocess.run([sys.executable, "-c", "import webapp.settings as s; print(s.DEBUG, s.SECRET_KEY)"], env=env,
                              capture_output=True, text=True, cwd=SETTINGS.parents[1])
        assert proc.returncode == 0, proc.stderr
        debug, value = proc.stdout.split()
        assert debug == "False"
        return value

    first = key()
    assert len(first) >= 50 and "insecure" not in first
    assert (tmp_path / "secret_key").read_text() == first and (tmp_path / "secret_key").stat().st_mode & 0o777 == 0o600
    assert key() == first  # the web, the worker and every command after it read the same one
    env["SECRET_KEY"] = "k" * 50
    assert key() == "k" * 50  # the environment's wins


def test_a_broken_key_file_stops_startup_naming_it(tmp_path):
    (tmp_path / "secret_key").write_text("short")
    env = {k: v for k, v in os.environ.items() if k not in ("SECRET_KEY", "DEBUG", "DATABASE_URL")}
    env.update(TROUPE_DATA_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", "import webapp.settings"], env=env, capture_output=True, text=True,
                          cwd=SETTINGS.parents[1])
    assert proc.returncode != 0 and "secret_key holds no usable key" in proc.stderr


def test_emails_go_to_files_in_the_data_dir_until_a_mail_server_is_set(monkeypatch, tmp_path):
    laptop = load(monkeypatch, tmp_path)
    assert laptop["EMAIL_BACKEND"].endswith("PrivateFileEmailBackend") and laptop["EMAIL_FILE_PATH"] == laptop["TROUPE_DATA_DIR"] / "emails"
    team = load(monkeypatch, tmp_path, EMAIL_HOST="smtp.example.org", EMAIL_PORT="2525", EMAIL_USE_TLS="false")
    assert team["EMAIL_BACKEND"].endswith("smtp.EmailBackend")
    assert (team["EMAIL_HOST"], team["EMAIL_PORT"], team["EMAIL_USE_TLS"]) == ("smtp.example.org", 2525, False)
    console = load(monkeypatch, tmp_path, EMAIL_HOST="", EMAIL_BACKEND="console")
    assert console["EMAIL_BACKEND"].endswith("console.EmailBackend")


@pytest.mark.parametrize(("env", "message"), [
    ({"EMAIL_BACKEND": "postfix"}, "EMAIL_BACKEND='postfix': use one of smtp, file, console"),
    ({"EMAIL_BACKEND": "smtp", "EMAIL_HOST": ""}, "EMAIL_BACKEND=smtp needs EMAIL_HOST"),
    ({"EMAIL_HOST": "smtp.example.org", "EMAIL_PORT": "twenty-five"}, "EMAIL_PORT"),
])
def test_a_bad_email_setting_stops_startup_naming_it(monkeypatch, tmp_path, env, message):
    with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
        load(monkeypatch, tmp_path, **env)
