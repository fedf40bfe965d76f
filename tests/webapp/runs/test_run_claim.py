"""A run is claimed atomically: a second (redelivered) task for the same run does nothing."""

from __future__ import annotations

from tests.webapp.conftest import FakeResult
from webapp.models import Run
from webapp.runs import services as run_services


def test_it_claims_a_queued_run_once(alice_world):
    calls = []

    def train(config, *, out_dir, sink):
        calls.append(out_dir)
        return FakeResult(status="succeeded", step=3)

    first = run_services.run_execute(run_id=alice_world.run.pk, worker="w1", train=train)
    second = run_services.run_execute(run_id=alice_world.run.pk, worker="w2", train=train)
    assert first is not None and first.status == "succeeded" and first.worker == "w1"
    assert second is None
    assert len(calls) == 1


def test_it_does_not_run_a_run_claimed_by_another_worker(alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING, worker="elsewhere")
    assert run_services.run_execute(run_id=alice_world.run.pk, train=lambda *a, **k: 1 / 0) is None
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "running" and alice_world.run.worker == "elsewhere"


def test_it_does_not_run_a_cancelled_run(alice_world):
    run_services.run_cancel(run=alice_world.run)
    assert run_services.run_execute(run_id=alice_world.run.pk, train=lambda *a, **k: 1 / 0) is None


def test_it_ignores_a_missing_run(db):
    assert run_services.run_execute(run_id=999_999, train=lambda *a, **k: 1 / 0) is None
