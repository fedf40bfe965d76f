"""Nothing is lost across a dropped connection or a dropped group message: a page that reconnects
with `?step=&log=` gets the database rows after those (and the newest episode's id), then live
deltas; a socket that misses a group message reads the gap from the database at the next one."""

from __future__ import annotations

from channels.layers import get_channel_layer

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
from webapp.models import LogLine, Rollout

pytestmark = TRANSACTIONAL


def test_it_fills_the_gap_after_a_reconnect(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=8)
        for step in (1, 2, 3):
            await worker.metrics(step, total=8)
            await worker.rollouts(step)
            await worker.log(f"step {step}")
        first = socket(alice_world.run.pk, alice.client)
        assert (await first.connect())[0]
        backlog = await receive_backlog(first)
        assert metric_steps(backlog) == [1, 2, 3]
        last_log = by_type(backlog, "log")[0]["lines"][-1]["id"]
        await first.disconnect()  # the network drops; the run goes on

        for step in (4, 5):
            await worker.metrics(step, total=8)
            await worker.rollouts(step)
            await worker.log(f"step {step}")

        again = socket(alice_world.run.pk, alice.client, f"step=3&log={last_log}")
        assert (await again.connect())[0]
        refill = await receive_backlog(again)
        assert metric_steps(refill) == [4, 5]
        assert by_type(refill, "rollouts")[0]["last_id"] == await orm(lambda: Rollout.objects.latest("id").pk)
        assert [line["message"].split(":")[0] for line in by_type(refill, "log")[0]["lines"]] == ["step 4/8", "step 4", "step 5/8", "step 5"]

        await worker.metrics(6, total=8)
        assert metric_steps(await receive_until(again, final_metrics)) == [6]
        await again.disconnect()

    run(scenario)


def test_it_reads_a_dropped_message_back_from_the_database(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=8)
        ws = socket(alice_world.run.pk, alice.client)
        assert (await ws.connect())[0]
        await receive_backlog(ws)
        await worker.metrics(1, total=8)
        assert metric_steps(await receive_until(ws, "log")) == [1]  # the step, then the sink's line for it

        layer = get_channel_layer()
        send, layer.group_send = layer.group_send, _drop  # Redis over capacity: steps 2 and 3 never arrive
        await worker.metrics(2, total=8)
        await worker.metrics(3, total=8)
        layer.group_send = send
        assert await receive_all(ws, timeout=0.2, first=0.2) == []

        await worker.metrics(4, total=8)
        assert metric_steps(await receive_until(ws, final_metrics)) == [2, 3, 4]  # the gap read back, in one catch-up
        await ws.disconnect()

    run(scenario)


def test_it_ignores_a_malformed_cursor(alice, alice_world):
    worker = Worker(alice_world.run)

    async def scenario():
        await worker.started(total=3)
        await worker.metrics(1, total=3)
        await orm(LogLine.objects.create, run_id=alice_world.run.pk, message="hello")
        ws = socket(alice_world.run.pk, alice.client, "step=abc&log=1e9&rollout=-1")
        assert (await ws.connect())[0]
        backlog = await receive_backlog(ws)
        assert metric_steps(backlog) == [1] and by_type(backlog, "log")[0]["lines"][-1]["message"] == "hello"
        await ws.disconnect()

    run(scenario)


async def _drop(group: str, message: dict) -> None:
    return None
