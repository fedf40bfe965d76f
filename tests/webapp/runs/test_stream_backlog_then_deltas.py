"""A socket gets the run's backlog from the database first (status, metrics, evaluations, episodes,
log), then the worker's live deltas, each step exactly once."""

from __future__ import annotations

from channels.layers import get_channel_layer
from django.urls import reverse

from tests.webapp.streams import (
    TRANSACTIONAL,
    Worker,
    by_type,
    final_metrics,
    metric_steps,
    orm,
    receive_all,
    receive_backlog,
    receive_until,
    run,
    socket,
)
from webapp.models import Rollout

pytestmark = TRANSACTIONAL


def test_it_sends_the_backlog_then_live_deltas(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=5)
        await worker.log("loaded policies")
        for step in (1, 2):
            await worker.metrics(step, total=5)
            await worker.rollouts(step)
        await worker.evaluation(2)

        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        backlog = await receive_backlog(ws)
        assert [m["t"] for m in backlog] == ["status", "metrics", "metrics", "evals", "rollouts", "log"]  # run-wide, then per agent
        assert backlog[0]["status"] == "running" and backlog[0]["total"] == 5
        assert metric_steps(backlog) == [1, 2] and backlog[2]["agents"]["tool"]["loss"][0] == [1, 2]
        # Only the last part moves the page's reconnect cursor (a drop in between asks again).
        assert [m["final"] for m in by_type(backlog, "metrics")] == [False, True]
        assert backlog[3]["rows"][0]["team"] == 0.25 and backlog[3]["rows"][0]["agents"]["tool"]["success"] == 0.5
        assert backlog[4] == {"t": "rollouts", "last_id": await orm(lambda: Rollout.objects.latest("id").pk)}
        # the engine's line, then the sink's own line per step and per evaluation
        assert [line["message"].split(":")[0] for line in backlog[5]["lines"]] == [
            "loaded policies", "step 1/5", "step 2/5", "held-out at step 2 (greedy, 8 tasks)"]

        await worker.metrics(3, total=5)
        delta = await receive_until(ws, "log")  # the step, then the sink's line for it
        assert [m["t"] for m in delta] == ["metrics", "log"]
        assert delta[0]["last"] == 3 and delta[0]["total"] == 5 and delta[0]["run"]["reward/total"][0] == [3]
        assert delta[0]["agents"]["reasoner"]["loss"] == [[3], [0.4]] and delta[0]["final"]

        await worker.rollouts(3, n=3, success=True)
        announced = await receive_until(ws, "rollouts")
        newest = await orm(lambda: Rollout.objects.latest("id").pk)
        assert announced == [{"t": "rollouts", "last_id": newest}]  # an id; the page fetches the episodes
        html = (await orm(alice.client.get, reverse("run_rollouts", args=[alice_world.run.pk]), {"after": backlog[4]["last_id"]})).content.decode()
        assert html.count('<article class="episode ok"') == 3 and 'data-step="3"' in html and 'data-step="2"' not in html

        await worker.log("checkpoint saved")
        await worker.evaluation(3)
        await worker.finish("succeeded", step=3)
        tail = await receive_until(ws, lambda m: m["t"] == "status" and m["status"] == "succeeded")
        tail += await receive_all(ws)  # and nothing after the end
        assert [line["message"].split(":")[0] for m in by_type(tail, "log") for line in m["lines"]] == [
            "checkpoint saved", "held-out at step 3 (greedy, 8 tasks)"]
        assert [r["step"] for m in by_type(tail, "evals") for r in m["rows"]] == [3]
        assert by_type(tail, "status")[-1]["status"] == "succeeded"
        assert metric_steps(tail) == []  # nothing sent twice
        await ws.disconnect()

    run(scenario)


def test_it_sends_each_viewer_the_same_live_step(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=3)
        sockets = [socket(alice_world.run.pk, alice.client) for _ in range(3)]
        for ws in sockets:
            assert (await ws.connect())[0]
            await receive_backlog(ws)
        await worker.metrics(1, total=3)
        for ws in sockets:
            assert metric_steps(await receive_until(ws, final_metrics)) == [1]
            await ws.disconnect()

    run(scenario)


def test_it_answers_a_ping(alice, alice_world):
    async def scenario():
        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        await ws.send_json_to({"t": "ping"})
        assert await receive_until(ws, "pong") == [{"t": "pong"}]
        await ws.disconnect()

    run(scenario)


def test_it_catches_up_at_a_ping_after_losing_its_group(alice, alice_world):
    """Redis restarted empty (or the day-long group expiry passed): the socket is open but no
    longer in the run's group. The page's next ping re-joins and sends what the database has."""
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=5)
        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        layer = get_channel_layer()
        layer.groups.clear()  # every membership gone
        await worker.metrics(1, total=5)
        await worker.rollouts(1)
        await worker.log("after the restart")
        assert await receive_all(ws, timeout=0.2, first=0.2) == []

        await ws.send_json_to({"t": "ping"})
        caught_up = await receive_until(ws, "pong")  # what the database has, then the answer
        assert metric_steps(caught_up) == [1]
        assert by_type(caught_up, "rollouts")[0]["last_id"] is not None
        assert [line["message"].split(":")[0] for line in by_type(caught_up, "log")[0]["lines"]] == ["step 1/5", "after the restart"]
        assert caught_up[-1] == {"t": "pong"}

        await worker.metrics(2, total=5)  # and it is back in the group
        assert metric_steps(await receive_until(ws, final_metrics)) == [2]
        await ws.disconnect()

    run(scenario)
