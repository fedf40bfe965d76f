"""Ctrl-C on `manage.py troupe` is quiet (issue 46, also seen): the worker it starts
(TROUPE_QUIET_CONSOLE=1) stops warm without Celery's "worker: Warm shutdown (MainProcess)" line; a
worker started by hand still says it. Two real workers on a private Redis, stopped with SIGTERM as
the command stops its worker."""

from __future__ import annotations

import pytest

from tests.processes import Processes
from webapp.management.commands import troupe

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_local_worker_stops_without_celerys_shutdown_line(tmp_path):
    procs = Processes(data_dir=tmp_path / "data", log_dir=tmp_path)
    procs.data_dir.mkdir()
    try:
        procs.start_redis()
        by_hand = procs.start_worker("by-hand")
        procs.extra_env["TROUPE_QUIET_CONSOLE"] = "1"
        local = procs.start_worker("local")
        procs.wait_online(by_hand, local, timeout=180)
        for hostname in (by_hand, local):
            procs.workers[hostname].terminate()
        assert [procs.workers[h].wait(120) for h in (by_hand, local)] == [0, 0]
    finally:
        procs.stop()
    assert "Warm shutdown" in (tmp_path / "by-hand.log").read_text()
    assert "Warm shutdown" not in (tmp_path / "local.log").read_text()


def test_the_command_starts_its_worker_quiet(monkeypatch):
    started = []
    monkeypatch.setattr(troupe, "_spawn", lambda cmd, env: started.append(env) or "new worker")
    monkeypatch.setattr(troupe.run_services, "run_fail_lost", lambda worker: 0)

    class Dead:
        returncode = -9

    troupe.Command()._restart_worker(Dead(), [], {"PATH": "/bin"})  # type: ignore[arg-type]
    assert started == [{"PATH": "/bin", "TROUPE_QUIET_CONSOLE": "1"}]
