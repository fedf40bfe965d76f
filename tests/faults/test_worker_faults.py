"""Real processes, real faults: two Celery workers serve the `gpu` queue over a real Redis with
the real engine on a tiny model, pointed at this test database.

- A worker is SIGKILLed mid-run: the other worker's sweep marks the run failed ("worker lost")
  within the configured limit, and resuming it from the run page continues at the checkpoint's
  step + 1 with the same data order, on the surviving worker.
- Cancel stops a running run within one step, saves a checkpoint there, and resume continues.
- A run that fails inside the engine leaves the worker alive for the next run; duplicate
  messages (a redelivery) never execute a run twice.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.urls import reverse

from tests.faults.conftest import TINY, TINY_YAML
from tests.faults.plugins import GATE_VAR
from tests.processes import Processes, wait_for
from tests.webapp.conftest import make_world
from training.data import batch_indices
from webapp.celery import app as celery_app
from webapp.core.env import celery_broker_url
from webapp.models import Checkpoint, Run, Worker
from webapp.runs import services as run_services
from webapp.runs.series import metrics_message

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOST_SECONDS = 15
"""TROUPE_WORKER_LOST_SECONDS for the workers and this process (a heartbeat every 2.5 s). Short
enough for a test, long enough that a healthy worker on a loaded 2-core machine (its heartbeat
thread starved for a few seconds while torch loads) is never taken for a dead one."""


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="module")
def fleet(django_db_setup, django_db_blocker, fleet_dir: Path) -> Iterator[Processes]:
    (fleet_dir / "data").mkdir()
    (fleet_dir / "logs").mkdir()
    fleet = Processes(data_dir=fleet_dir / "data", log_dir=fleet_dir / "logs",
                      env={"TROUPE_WORKER_LOST_SECONDS": str(LOST_SECONDS), GATE_VAR: str(fleet_dir / "gate-open")})
    with django_db_blocker.unblock():
        fleet.start_redis()
        fleet.a = fleet.start_worker("a")  # type: ignore[attr-defined]
        fleet.b = fleet.start_worker("b")  # type: ignore[attr-defined]
        old = celery_app.conf.broker_url
        _use_broker(celery_broker_url(fleet.redis_url))
        try:
            yield fleet
        finally:
            _use_broker(old)
            fleet.stop()


def _use_broker(url: str) -> None:
    """Point this process's Celery app (run_create's enqueue) at `url`, dropping cached pools."""
    celery_app.conf.broker_url = url
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


@pytest.fixture(autouse=True)
def data_dir(settings, fleet_dir: Path) -> Path:  # the workers' data dir, for every test here
    settings.TROUPE_DATA_DIR = fleet_dir / "data"
    settings.TROUPE_WORKER_LOST_SECONDS = LOST_SECONDS
    return fleet_dir / "data"


def queue(team, *, steps: int, advanced_yaml: str = "", name: str = "fault", world=None) -> Run:  # type: ignore[no-untyped-def]
    if world is None:
        world = make_world(team)
        Run.objects.filter(pk=world.run.pk).update(status=Run.Status.CANCELLED)  # make_world's own run stays out of the queue
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name=name,
                                       overrides={**TINY, "optim.steps": steps}, advanced_yaml=TINY_YAML + advanced_yaml)
    return run_services.run_create(team=team, user=None, name=name, config=config, topology=world.topology, dataset=world.dataset)


def until(run: Run, what: str, check, fleet: Processes, timeout: float = 300):  # type: ignore[no-untyped-def]
    def probe():  # type: ignore[no-untyped-def]
        run.refresh_from_db()
        return check(run)

    try:
        return wait_for(probe, what, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; run is {run.status}: {run.error_message}\n{fleet.logs()}") from None


def expected_task(step: int) -> str:
    """The task a tiny run trains on at `step` (one per step): the data order resume must replay."""
    return f"train-{batch_indices(32, 1, step, 0)[0]}@{step}"


def test_a_killed_workers_run_is_marked_lost_and_resumes_on_another_worker(alice, fleet):
    fleet.wait_online(fleet.a, fleet.b)
    # The run holds in its second step (tests.faults.plugins:gated_reward) until the gate opens, so
    # the worker dies mid-run however fast the machine; the survivor finds the gate open.
    run = queue(alice.team, steps=7, advanced_yaml="data: {reward_fn: 'tests.faults.plugins:gated_reward'}\n")
    until(run, "a checkpoint at step 1", lambda r: r.checkpoints.filter(step__gte=1).exists(), fleet)
    victim = run.worker
    assert victim in (fleet.a, fleet.b)
    fleet.kill_worker(victim)
    (fleet.data_dir.parent / "gate-open").touch()
    killed_at = time.monotonic()
    run.refresh_from_db()
    assert run.status == Run.Status.RUNNING  # nothing knows yet

    until(run, "the sweep", lambda r: r.status == Run.Status.FAILED, fleet, timeout=LOST_SECONDS + 120)
    noticed_after = time.monotonic() - killed_at
    assert run.error_message.startswith(f"worker lost: {victim} stopped sending heartbeats"), run.error_message
    # Not before the limit (how soon after it is the sweep's timing, which a loaded machine stretches:
    # tests/webapp/runs/test_run_sweep_lost.py checks the rule itself on a fixed clock).
    assert noticed_after >= LOST_SECONDS - 1, noticed_after
    heard = int(run.error_message.split("last heard ")[1].split(" s ago")[0])
    assert heard >= LOST_SECONDS, run.error_message
    # The sweeper writes the run's log line after its status, in a commit of its own.
    until(run, "the sweep's log line", lambda r: r.log_lines.filter(level="error", message__startswith="worker lost").exists(), fleet)

    resumed_at = run.checkpoints.order_by("-step").first().step
    response = alice.client.post(reverse("run_resume", args=[run.pk]))
    new = Run.objects.get(resumed_from=run)
    assert response["Location"] == new.get_absolute_url() and new.resumed_at_step == resumed_at
    until(new, "the resumed run", lambda r: not r.is_active, fleet)
    assert new.status == Run.Status.SUCCEEDED, new.error_message
    survivor = fleet.b if victim == fleet.a else fleet.a
    assert new.worker == survivor

    steps = list(new.metric_points.values_list("step", flat=True))
    assert steps == list(range(resumed_at + 1, 8))  # continues at the same step
    first = new.rollouts.filter(step=resumed_at + 1).first()
    assert first.data["task_id"] == expected_task(resumed_at + 1)  # with the same data order
    assert run.rollouts.filter(step=1).first().data["task_id"] == expected_task(1)
    # The new run's charts start with the old run's curve up to the resumed step.
    series = metrics_message(run_id=new.pk)["run"]["reward/total"]
    assert series[0] == list(range(1, 8))


def test_cancel_stops_within_a_step_saves_a_checkpoint_and_resume_continues(alice, fleet):
    # Only the stop itself saves a checkpoint. The run holds in its second step until the stop has
    # been asked for (tests.faults.plugins:cancel_gated_reward), so a fast machine cannot finish first.
    run = queue(alice.team, steps=6, advanced_yaml="checkpoint: {every: 0}\ndata: {reward_fn: 'tests.faults.plugins:cancel_gated_reward'}\n")
    until(run, "step 1", lambda r: r.step >= 1, fleet)
    alice.client.post(reverse("run_cancel", args=[run.pk]))
    asked_at = Run.objects.get(pk=run.pk).step
    (fleet.data_dir.parent / "gate-open-cancel").touch()
    until(run, "the stop", lambda r: not r.is_active, fleet, timeout=120)
    assert run.status == Run.Status.CANCELLED and run.error_message == ""
    # The stop is polled between steps: a request that lands before the worker's poll for step 2
    # stops the run at step 1, one that lands after it (the worker already held in step 2) at step 2.
    # Never later, and never at the end.
    assert asked_at == 1 and run.step in (1, 2), (asked_at, run.step)
    assert run.log_lines.filter(message=f"stop requested: saving a checkpoint at step {run.step}").exists()
    checkpoint = Checkpoint.objects.get(run=run)
    assert checkpoint.step == run.step and Path(checkpoint.path).is_dir()

    alice.client.post(reverse("run_resume", args=[run.pk]))
    new = Run.objects.get(resumed_from=run)
    until(new, "the resumed run", lambda r: not r.is_active, fleet)
    assert new.status == Run.Status.SUCCEEDED, new.error_message
    assert list(new.metric_points.values_list("step", flat=True)) == list(range(run.step + 1, 7))


def test_a_failed_run_leaves_the_worker_for_the_next_and_no_run_executes_twice(alice, fleet):
    survivors = [h for h in (fleet.a, fleet.b) if fleet.workers[h].poll() is None]
    stale = unacked(fleet)  # a message a worker killed earlier in this module held stays out until its visibility timeout
    world = make_world(alice.team)
    Run.objects.filter(pk=world.run.pk).update(status=Run.Status.CANCELLED)
    bad = queue(alice.team, steps=2, name="bad", world=world,
                advanced_yaml="data: {reward_fn: 'tests.faults.plugins:exploding_reward'}\n")
    good = queue(alice.team, steps=1, name="good", world=world)
    run_services.run_enqueue(run=good)  # duplicate messages, as a broker redelivery would send
    run_services.run_enqueue(run=good)
    # The two workers take the two runs side by side: either may end first.
    until(good, "the good run", lambda r: not r.is_active, fleet)
    until(bad, "the bad run", lambda r: not r.is_active, fleet)
    assert bad.status == Run.Status.FAILED and "reward plugin exploded" in bad.error_message and bad.traceback
    assert good.status == Run.Status.SUCCEEDED, good.error_message
    assert good.worker in survivors and bad.worker in survivors
    # Every message, the spare ones included, has been taken and its task has returned (each finds
    # nothing queued); only then can the test say that none ran a run twice.
    wait_for(lambda: broker_drained(fleet, stale), "the workers to take and acknowledge every message", 120)
    assert all(fleet.workers[h].poll() is None for h in survivors)  # the worker process survived the failure
    assert good.log_lines.filter(message__contains="training tasks").count() == 1  # executed once
    assert Run.objects.filter(status__in=Run.ACTIVE).count() == 0
    assert Worker.objects.filter(hostname__in=survivors, run__isnull=False).count() == 0  # let go as each task returned


def unacked(fleet: Processes) -> set[bytes]:
    """The delivery tags of the messages out with a worker: kombu keeps a delivered message in the
    `unacked` hash until its task acknowledges it, which these tasks do when they return (`acks_late`)."""
    import redis

    client = redis.Redis.from_url(fleet.redis_url)
    try:
        return set(client.hkeys("unacked"))
    finally:
        client.close()


def broker_drained(fleet: Processes, stale: set[bytes]) -> bool:
    """No message waits in the `gpu` queue (kombu keeps a queue's messages in a Redis list named
    after it) and none but the `stale` ones (held by a worker that is gone) is out with a worker."""
    import redis

    client = redis.Redis.from_url(fleet.redis_url)
    try:
        return client.llen("gpu") == 0 and not unacked(fleet) - stale
    finally:
        client.close()
