"""The worker publishes after the database commit, small messages only, and never lets the
channel layer break a run."""

from __future__ import annotations

import pytest
from django.db import transaction

from tests.webapp.streams import TRANSACTIONAL, step_metrics
from webapp.runs import publish
from webapp.runs.sink import DatabaseSink

pytestmark = TRANSACTIONAL


@pytest.fixture
def sent(monkeypatch):
    calls = []

    class Layer:
        async def group_send(self, group, message):
            calls.append((group, message))

    monkeypatch.setattr(publish, "get_channel_layer", lambda: Layer())
    monkeypatch.setattr(publish, "_quiet_until", 0.0)
    return calls


def test_it_publishes_after_the_commit_and_not_on_rollback(alice_world, sent):
    sink = DatabaseSink(alice_world.run)
    with transaction.atomic():
        sink.metrics(step_metrics(1))
        assert sent == []  # not yet: the row is not committed
    assert [(g, m["event"]) for g, m in sent] == [(f"run-{alice_world.run.pk}", "metrics"), (f"run-{alice_world.run.pk}", "log")]
    assert sent[0][1]["type"] == "run.event" and sent[0][1]["payload"]["step"] == 1 and sent[0][1]["payload"]["total_steps"] == 10
    assert sent[1][1]["payload"]["message"].startswith("step 1/10: reward +")  # the run log's line for the step

    with pytest.raises(RuntimeError), transaction.atomic():
        sink.metrics(step_metrics(2))
        raise RuntimeError
    assert len(sent) == 2


def test_it_sends_rollout_summaries_not_episodes(alice_world, sent):
    from tests.webapp.streams import episode

    DatabaseSink(alice_world.run).rollouts(3, [episode(3, i) for i in range(4)])
    newest = alice_world.run.rollouts.latest("id").pk
    assert sent[0][1]["payload"] == {"step": 3, "episodes": 4, "success": 0, "last_id": newest}


def test_it_replaces_an_oversized_payload_with_a_stub(alice_world, sent):
    publish.publish(run_id=alice_world.run.pk, event="log", payload={"message": "x" * 200_000, "level": "info"})
    assert sent[0][1]["payload"] == {"step": None, "too_big": True}


def test_it_never_raises_and_backs_off_when_the_layer_fails(alice_world, monkeypatch):
    attempts = []

    class Broken:
        async def group_send(self, group, message):
            attempts.append(group)
            raise ConnectionError("redis is down")

    monkeypatch.setattr(publish, "get_channel_layer", lambda: Broken())
    monkeypatch.setattr(publish, "_quiet_until", 0.0)
    sink = DatabaseSink(alice_world.run)
    sink.metrics(step_metrics(1))
    sink.metrics(step_metrics(2))  # inside the back-off window: not even tried
    assert len(attempts) == 1
    assert alice_world.run.metric_points.count() == 2  # the database has both steps
