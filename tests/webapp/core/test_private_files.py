"""The data dir is closed to other accounts whatever the umask (issue 31, class 2): another local
account read live session keys from a world-readable `troupe.sqlite3`, and reset links from
`emails/`. Every test here runs under a permissive umask (0o022, 0o000)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core import mail
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tests.webapp.conftest import jsonl
from webapp.core.private import data_dir_tighten, private_file
from webapp.models import Dataset

ROOT = Path(__file__).resolve().parents[3]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture(params=[0o022, 0o000])
def permissive_umask(request) -> Iterator[int]:
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _old_install(root: Path) -> None:
    """What an install made before this left: everything readable by all."""
    for folder in ("runs/7/checkpoints/step-000002", "emails", "datasets/1", "exports/1"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for file in ("troupe.sqlite3", "troupe.sqlite3-wal", "emails/reset.log", "runs/7/checkpoints/step-000002/adapter.safetensors",
                 "datasets/1/abc.jsonl", "redis.log"):
        (root / file).write_text("x")
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def test_a_deep_tighten_closes_an_old_install_and_follows_no_link(tmp_path, permissive_umask):
    data = tmp_path / "data"
    _old_install(data)
    outside = tmp_path / "outside.txt"
    outside.write_text("not ours to change")
    outside.chmod(0o644)
    (data / "runs" / "7" / "link").symlink_to(outside)
    assert data_dir_tighten(data, deep=True) == []
    for path in [data, *data.rglob("*")]:
        if not path.is_symlink():
            assert mode(path) & 0o077 == 0, (path, oct(mode(path)))
    assert mode(outside) == 0o644


def test_a_shallow_tighten_closes_the_data_dir_and_its_top_level(tmp_path, permissive_umask):
    data = tmp_path / "data"
    _old_install(data)
    data_dir_tighten(data, deep=False)
    assert mode(data) == 0o700 and mode(data / "troupe.sqlite3") == 0o600 and mode(data / "emails") == 0o700
    private_file(data / "new.sqlite3")
    assert mode(data / "new.sqlite3") == 0o600


def test_emails_are_written_private(settings, tmp_path, permissive_umask):
    settings.EMAIL_BACKEND = "webapp.core.private.PrivateFileEmailBackend"
    settings.EMAIL_FILE_PATH = tmp_path / "emails"
    mail.send_mail("Reset", "https://troupe.example.org/password-reset/x/y/", None, ["carol@example.org"])
    (sent,) = (tmp_path / "emails").iterdir()
    assert mode(tmp_path / "emails") == 0o700 and mode(sent) == 0o600 and "password-reset" in sent.read_text()


def test_an_upload_is_stored_private(alice, good_rows, data_dir, permissive_umask):
    data = {"name": "mine", "environment": "math_tool", "eval_fraction": "0.25",
            "file": SimpleUploadedFile("tasks.jsonl", jsonl(good_rows), content_type="application/octet-stream")}
    assert alice.client.post(reverse("dataset_upload"), data).status_code == 302
    stored = data_dir / Dataset.objects.get(team=alice.team).file
    assert mode(stored) == 0o600 and mode(stored.parent) == 0o700 and mode(stored.parent.parent) == 0o700


def test_a_worker_starting_sets_a_private_umask_and_closes_the_tree(settings, tmp_path, permissive_umask):
    from webapp.celery import _private_files

    settings.TROUPE_DATA_DIR = tmp_path / "data"
    _old_install(settings.TROUPE_DATA_DIR)
    _private_files()
    try:
        assert os.umask(0o077) == 0o077
        assert mode(settings.TROUPE_DATA_DIR / "runs/7/checkpoints/step-000002/adapter.safetensors") == 0o600
        assert mode(settings.TROUPE_DATA_DIR / "emails/reset.log") == 0o600
    finally:
        os.umask(permissive_umask)


def test_manage_py_makes_a_new_data_dir_private_whatever_the_umask(tmp_path):
    """One real process: `manage.py shell` started from a shell with umask 000 makes the data dir,
    the SQLite database and its WAL files, the secret key and what it writes 0700/0600, and
    closes what an old install left readable at the top of the data dir."""
    data = tmp_path / "data"
    _old_install(data)
    (data / "troupe.sqlite3").unlink()
    (data / "troupe.sqlite3-wal").unlink()
    script = (
        "import os; from django.db import connection; from django.conf import settings;"
        "connection.cursor().execute('create table probe (x int)');"
        "open(os.path.join(settings.TROUPE_DATA_DIR, 'runs', 'new-output.txt'), 'w').write('x');"
        "db = str(settings.DATABASES['default']['NAME']);"
        "print(*[oct(os.stat(db + s).st_mode & 0o777) for s in ('-wal', '-shm')]);"  # while the connection holds them
        "print(oct(os.umask(0o077)))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "SECRET_KEY")}
    env.update(TROUPE_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="webapp.settings")
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", script], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120, preexec_fn=lambda: os.umask(0))
    assert result.returncode == 0, result.stderr
    wal_modes, umask = result.stdout.strip().splitlines()[-2:]
    assert wal_modes == "0o600 0o600" and umask == "0o77"  # the WAL files, and the process's umask
    assert mode(data) == 0o700 and mode(data / "secret_key") == 0o600 and mode(data / "emails") == 0o700
    for name in ("troupe.sqlite3", "runs/new-output.txt", "redis.log"):
        assert mode(data / name) == 0o600, (name, oct(mode(data / name)))
