"""Crash recovery without real processes: a running run whose heartbeat went stale is marked
failed ("worker lost") by the sweep, never twice, never a live one; a swept run keeps that outcome
even if its process wakes up; a restarted worker fails what its previous process left running;
the heartbeat thread keeps a slow run alive."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.conftest import FakeResult
from webapp.models import Checkpoint, Run, Worker
from webapp.ops import workers
from webapp.runs import queue
from webapp.runs import services as run_services
from webapp.runs.sink import DatabaseSink


def running(run: Run, *, heard_s_ago: float, worker: str = "gpu0@a") -> Run:
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=Run.Status.RUNNING, worker=worker, started=now - timedelta(seconds=heard_s_ago + 5),
        heartbeat=now - timedelta(seconds=heard_s_ago),
    )
    run.refresh_from_db()
    return run


def test_it_marks_a_run_with_a_stale_heartbeat_failed(alice_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 60
    run = running(alice_world.run, heard_s_ago=61)
    Worker.objects.create(hostname="gpu0@a", run=run)
    assert queue.run_sweep_lost() == [run.pk]
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and run.finished is not None
    assert run.error_message.startswith("worker lost: gpu0@a stopped sending heartbeats")
    assert "limit is 60 s" in run.error_message and "Resume" in run.error_message
    assert run.log_lines.get().level == "error"
    assert Worker.objects.get().run is None
    assert queue.run_sweep_lost() == []  # already failed: a second sweeper does nothing


def test_it_leaves_live_runs_and_other_states_alone(alice_world, bob_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 60
    running(alice_world.run, heard_s_ago=30)
    Run.objects.filter(pk=bob_world.run.pk).update(heartbeat=timezone.now() - timedelta(hours=3))  # queued
    assert queue.run_sweep_lost() == []
    assert set(Run.objects.values_list("status", flat=True)) == {"running", "queued"}


def test_it_marks_a_run_that_never_beat(alice_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 60
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING, heartbeat=None,
                                                     started=timezone.now() - timedelta(minutes=5))
    assert queue.run_sweep_lost() == [alice_world.run.pk]


def test_the_limit_comes_from_the_environment(alice_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 5
    run = running(alice_world.run, heard_s_ago=6)
    assert queue.run_sweep_lost() == [run.pk]


def test_a_swept_run_stays_failed_when_its_process_wakes_up(alice_world, settings):
    """A frozen (or cut-off) process is swept; when it resumes, its next step sees the run is no
    longer running, stops with a checkpoint, and its end does not overwrite "worker lost"."""
    settings.TROUPE_WORKER_LOST_SECONDS = 60

    def train(config, *, out_dir, sink):
        assert not sink.should_stop()
        running(Run.objects.get(pk=alice_world.run.pk), heard_s_ago=120, worker="w")  # the process froze...
        assert queue.run_sweep_lost() == [alice_world.run.pk]  # ...and another worker swept it
        assert sink.should_stop()  # woken up: stop at this step
        sink.checkpoint(1, str(out_dir / "checkpoints" / "step-000001"))
        return FakeResult(status="cancelled", step=1, checkpoint=str(out_dir / "checkpoints" / "step-000001"))

    run = run_services.run_execute(run_id=alice_world.run.pk, worker="w", train=train)
    assert run.status == Run.Status.FAILED and run.error_message.startswith("worker lost")
    assert Checkpoint.objects.filter(run=run, step=1).exists()  # resumable from where it stopped
    assert run.can_resume


def test_a_restarted_worker_fails_what_its_previous_process_left_running(alice_world, bob_world):
    running(alice_world.run, heard_s_ago=1, worker="gpu0@a")
    running(bob_world.run, heard_s_ago=1, worker="gpu1@a")
    assert workers.worker_started(hostname="gpu0@a", queues=["gpu"], pid=1) == 1
    alice_world.run.refresh_from_db()
    bob_world.run.refresh_from_db()
    assert alice_world.run.status == "failed" and alice_world.run.error_message.startswith("worker lost")
    assert bob_world.run.status == "running"


def test_a_finished_run_can_be_finished_only_once(alice_world):
    run = running(alice_world.run, heard_s_ago=0)
    sink = DatabaseSink(run)
    sink.finish(status=Run.Status.SUCCEEDED, step=3)
    sink.finish(status=Run.Status.FAILED, error="late")
    run.refresh_from_db()
    assert run.status == Run.Status.SUCCEEDED and run.error_message == ""


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_keeps_a_slow_run_alive(alice, settings):
    """A step that takes longer than the lost-worker limit (a big model loading) is not swept:
    the heartbeat thread writes while the step runs."""
    from tests.webapp.conftest import make_world

    settings.TROUPE_WORKER_LOST_SECONDS = 3
    settings.TROUPE_HEARTBEAT_SECONDS = 0.5
    world = make_world(alice.team)
    swept: list[list[int]] = []

    def slow_train(config, *, out_dir, sink):
        for _ in range(8):  # 4 s without any sink call
            time.sleep(0.5)
            swept.append(queue.run_sweep_lost())
        return FakeResult(status="succeeded", step=3)

    run = run_services.run_execute(run_id=world.run.pk, worker="w", train=slow_train)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert not any(swept)


def test_the_sweeper_thread_sweeps(alice_world, settings):
    settings.TROUPE_WORKER_LOST_SECONDS = 60
    run = running(alice_world.run, heard_s_ago=90)
    workers.Sweeper().tick()
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED


def test_the_web_process_starts_a_sweeper(tmp_path):
    """So a deployment whose only worker is gone for good still fails its run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DEBUG="1", TROUPE_DATA_DIR=str(tmp_path))
    code = "import threading, webapp.asgi; print(sorted(t.name for t in threading.enumerate()))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[3], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "troupe-sweeper" in proc.stdout
