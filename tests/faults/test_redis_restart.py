"""Redis dies mid-run and comes back empty (SIGKILL, no persistence): training goes on (the sink's
publish logs and continues, database writes continue), no metric is lost, and a live viewer of the
run page, reconnecting as the page does, ends up with every step and the final status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.conftest import TINY, TINY_YAML
from tests.processes import LiveViewer, Processes, wait_for
from tests.webapp.conftest import make_world
from webapp.celery import app as celery_app
from webapp.core.env import celery_broker_url
from webapp.models import Run
from webapp.runs import services as run_services

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STEPS = 10


@pytest.fixture
def fleet(data_dir: Path, tmp_path: Path) -> Iterator[Processes]:
    (tmp_path / "logs").mkdir()
    fleet = Processes(data_dir=data_dir, log_dir=tmp_path / "logs")
    fleet.start_redis()
    fleet.worker = fleet.start_worker("w")  # type: ignore[attr-defined]
    fleet.start_web()
    old = celery_app.conf.broker_url
    _use_broker(celery_broker_url(fleet.redis_url))
    try:
        yield fleet
    finally:
        _use_broker(old)
        fleet.stop()


def _use_broker(url: str) -> None:
    celery_app.conf.broker_url = url
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


def test_training_and_the_live_page_survive_a_redis_restart(alice, fleet):
    world = make_world(alice.team)
    Run.objects.filter(pk=world.run.pk).update(status=Run.Status.CANCELLED)
    config = run_services.run_config_build(topology=world.topology, dataset=world.dataset, name="through a redis restart",
                                       overrides={**TINY, "optim.steps": STEPS}, advanced_yaml=TINY_YAML)
    run = run_services.run_create(team=alice.team, user=alice.user, name="redis", config=config, topology=world.topology,
                              dataset=world.dataset)
    viewer = LiveViewer(port=fleet.port, run_id=run.pk, session_cookie=alice.client.cookies["sessionid"].value)
    viewer.start()
    try:
        def step() -> int:
            run.refresh_from_db()
            return run.step

        wait_for(lambda: step() >= 2, "step 2", 300)
        wait_for(lambda: {1, 2} <= viewer.steps, "the viewer to see steps 1-2", 120)
        fleet.kill_redis()
        down_at = step()
        # Training goes on while Redis is down: wait for the next step (an event, not a time budget
        # that a loaded machine misses), however long a step takes here.
        try:
            wait_for(lambda: step() > down_at or not run.is_active, "a step while Redis is down", 180)
        except AssertionError:
            raise AssertionError(f"training stalled while Redis was down\n{fleet.logs()}") from None
        assert run.status == Run.Status.RUNNING or run.status == Run.Status.SUCCEEDED, run.error_message
        assert step() > down_at
        fleet.start_redis()  # empty: no groups, no queues
        # From here the viewer pings every second rather than every 25 s as the page does: what one
        # ping does (re-join the group the empty Redis forgot, send what the database has after the
        # viewer's step) is the same, without waiting 25 s for it.
        viewer.ping_every = 1.0

        wait_for(lambda: step() and not run.is_active, "the run to finish", 300)
        assert run.status == Run.Status.SUCCEEDED, f"{run.error_message}\n{fleet.logs()}"
        assert list(run.metric_points.values_list("step", flat=True)) == list(range(1, STEPS + 1))  # no metric lost
        wait_for(lambda: set(range(1, STEPS + 1)) <= viewer.steps and "succeeded" in viewer.statuses,
                 f"the live viewer to catch up (it has {sorted(viewer.steps)}, {viewer.statuses})", 90)  # its ping re-joins
        assert "could not publish" in (fleet.log_dir / "w.log").read_text(errors="replace")  # logged, and went on
    finally:
        viewer.stop()
