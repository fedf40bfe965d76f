"""Helpers for the live-streaming tests: a websocket to the real ASGI app (origin check, session
auth, routing) with `channels.testing.WebsocketCommunicator`, and sink events written and published
the way the worker does it (rows committed, then `DatabaseSink.published` -> the channel layer).

The tests are sync and use transactional databases (`pytestmark = TRANSACTIONAL`): Channels'
`database_sync_to_async` closes old connections around each call, which would end the `db`
fixture's wrapping transaction, and the sink's publish must really happen after a real commit.
Each test runs its async scenario with `run(...)`; ORM work inside a scenario goes through `orm(...)`."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from training.events import StepMetrics
from webapp.asgi import application
from webapp.runs.sink import DatabaseSink

TRANSACTIONAL = pytest.mark.django_db(transaction=True)


def run(scenario: Callable[[], Awaitable[Any]]) -> Any:
    channel_layers.backends.clear()  # a fresh InMemoryChannelLayer: no groups or queues from earlier loops
    return async_to_sync(scenario)()


def orm(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
    return database_sync_to_async(fn)(*args, **kwargs)


def socket(run_id: int, client: Client | None, query: str = "") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if client is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()))
    return WebsocketCommunicator(application, f"/ws/runs/{run_id}/" + (f"?{query}" if query else ""), headers=headers)


async def receive_all(ws: WebsocketCommunicator, timeout: float = 1.0, *, first: float | None = None) -> list[dict[str, Any]]:
    """Every message the socket sends until it has been quiet for `timeout` seconds, after waiting
    up to `first` seconds (default 15) for the first one: a busy machine may take its time to send
    what the test waits for, and the long first wait ends as soon as it comes. A call that expects
    nothing passes `first` as short as `timeout`."""
    out = []
    while not await ws.receive_nothing(timeout=(15.0 if first is None else first) if not out else timeout):
        out.append(await ws.receive_json_from())
    return out


async def receive_backlog(ws: WebsocketCommunicator, first: float = 30.0) -> list[dict[str, Any]]:
    """What the socket sends as it opens, up to and including the log tail that ends the backlog
    (`streaming.stream_open` sends it last, so that the page knows the backlog is complete): an
    event to wait on, where a quiet period could cut a slow backlog in two on a busy machine."""
    out: list[dict[str, Any]] = []
    while not out or out[-1]["t"] != "log":
        out.append(await ws.receive_json_from(timeout=first))
    return out


def by_type(messages: list[dict[str, Any]], t: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["t"] == t]


def metric_steps(messages: list[dict[str, Any]], key: str = "reward/total") -> list[int]:
    steps: list[int] = []
    for m in by_type(messages, "metrics"):
        steps += m["run"].get(key, [[], []])[0]
    return steps


def step_metrics(step: int, total: int = 10) -> StepMetrics:
    return StepMetrics(
        step=step, total_steps=total, time=time.time(),
        values={"reward/total": 0.1 * step, "reward/team": 0.05 * step, "success": 0.5, "step_time": 1.5, "tokens_per_s": 120.0},
        agents={"tool": {"reward/total": 0.2, "loss": 0.3, "kl": 0.01}, "reasoner": {"reward/total": 0.1, "loss": 0.4, "kl": 0.02}},
    )


def episode(step: int, i: int = 0, *, success: bool = False, agents: tuple[str, ...] = ("tool", "reasoner")) -> dict[str, Any]:
    return {
        "task_id": f"t{i}@{step}", "step": step, "success": success, "team_reward": 1.0 if success else 0.0,
        "question": f"What is {step} + {i}?",
        "turns": [
            {
                "index": n, "agent": name, "role": name, "prompt": f"<prompt for {name}>", "chosen": 1,
                "candidates": [
                    {"text": f"{name} candidate {k}", "reward": 0.5 * k, "team": 0.0, "local": 0.5 * k, "advantage": k - 0.5,
                     "tool_output": "stdout: 42\nstderr: " if name == "tool" else None, "tokens": 7, "truncated": False}
                    for k in range(2)
                ],
            }
            for n, name in enumerate(agents)
        ],
    }


class Worker:
    """The worker's side of a run: a DatabaseSink; each event commits, then publishes."""

    def __init__(self, run: Any):
        self.sink = DatabaseSink(run)

    async def started(self, total: int = 10, start: int = 0) -> None:
        from webapp.models import Run

        def claim() -> None:
            Run.objects.filter(pk=self.sink.run_id).update(status="running")
            self.sink.run_started(total_steps=total, start_step=start)

        await orm(claim)

    async def metrics(self, step: int, total: int = 10) -> None:
        await orm(self.sink.metrics, step_metrics(step, total))

    async def rollouts(self, step: int, n: int = 2, **kw: Any) -> None:
        await orm(self.sink.rollouts, step, [episode(step, i, **kw) for i in range(n)])

    async def log(self, message: str) -> None:
        await orm(self.sink.log, message)

    async def evaluation(self, step: int) -> None:
        result = {"step": step, "split": "eval", "temperature": 0.0, "n": 8, "team": {"success": 0.25},
                  "agents": {"tool": {"success": 0.5, "reward": 0.4}, "reasoner": {"success": 0.25, "reward": 0.2}}, "examples": []}
        await orm(self.sink.evaluation, result)

    async def finish(self, status: str = "succeeded", step: int | None = None) -> None:
        await orm(lambda: self.sink.finish(status=status, step=step))
