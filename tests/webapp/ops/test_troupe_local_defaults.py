"""`manage.py troupe` runs as the shipped product does: DEBUG off unless asked, plain HTTP only on a
loopback address (where no one else can connect and a browser needs no certificate), and a quiet
console: no access log, no worker banner, no per-task lines."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from webapp.management.commands import troupe

MANAGE = Path(__file__).resolve().parents[3] / "manage.py"


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_it_serves_plain_http_on_a_loopback_address(host):
    assert troupe.child_env({"PATH": "/bin"}, host=host) == {"PATH": "/bin", "TROUPE_HTTPS": "0"}


def test_it_keeps_https_on_elsewhere_and_an_explicit_choice_everywhere():
    assert "TROUPE_HTTPS" not in troupe.child_env({}, host="0.0.0.0")
    assert troupe.child_env({"TROUPE_HTTPS": "1"}, host="127.0.0.1")["TROUPE_HTTPS"] == "1"


def test_debug_is_not_switched_on_for_it():
    assert 'setdefault("DEBUG"' not in MANAGE.read_text()


def test_its_children_keep_the_console_quiet():
    cmd = troupe.WORKER_CMD
    assert cmd[cmd.index("--loglevel") + 1] == "WARNING" and "--quiet" in cmd  # no banner, no "Task ... received"
    assert cmd[:2] == [sys.executable, "-m"]


def test_it_starts_daphne_without_an_access_log(monkeypatch, db, tmp_path, settings):
    spawned: list[list[str]] = []

    class Running:
        returncode = None

        def poll(self):
            return None

    def spawn(cmd, env):
        spawned.append(cmd)
        if "daphne" in cmd:
            raise SystemExit(0)  # enough: stop before serving
        return Running()

    monkeypatch.setattr(troupe, "_spawn", spawn)
    monkeypatch.setattr(troupe, "_port_open", lambda host, port: False)
    settings.REDIS_URL = "redis://unused:6379/0"
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit):
            troupe.Command().handle(seed_only=False, no_worker=True, port=8799, host="127.0.0.1")
    finally:
        for sig, handler in handlers.items():  # the command takes Ctrl-C for itself
            signal.signal(sig, handler)
    daphne = next(cmd for cmd in spawned if "daphne" in cmd)
    assert daphne[daphne.index("-v") + 1] == "0"
