"""`manage.py troupe` supervises its worker: a worker that dies has its run failed at once
("worker lost", resumable) and is started again, but a worker that keeps dying stops Troupe."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from webapp.management.commands import troupe
from webapp.models import Run


class DeadProcess:
    returncode = -9

    def poll(self) -> int:
        return self.returncode


def test_it_fails_the_lost_run_and_starts_a_new_worker(alice_world, monkeypatch):
    started = []
    monkeypatch.setattr(troupe, "_spawn", lambda cmd, env: started.append(cmd) or "new worker")
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING, worker=troupe.WORKER_NAME)
    command = troupe.Command()
    assert command._restart_worker(DeadProcess(), [], {}) == "new worker"
    assert started == [troupe.WORKER_CMD]
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "failed" and alice_world.run.error_message.startswith("worker lost")


def test_it_gives_up_on_a_worker_that_keeps_dying(db, monkeypatch):
    monkeypatch.setattr(troupe, "_spawn", lambda cmd, env: "new worker")
    command = troupe.Command()
    restarts: list[float] = []
    for _ in range(troupe.WORKER_MAX_RESTARTS):
        command._restart_worker(DeadProcess(), restarts, {})
    with pytest.raises(CommandError, match="exited 4 times"):
        command._restart_worker(DeadProcess(), restarts, {})
