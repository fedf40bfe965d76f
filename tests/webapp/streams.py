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


class Socket(WebsocketCommunicator):
    """A websocket to the app whose handshake and close wait for the consumer (its checks read the
    database in a thread, on its own schedule) up to 30 s, a safety net for a hang; Channels'
    default of 1 s is a guess that a busy machine can miss."""

    async def connect(self, timeout: float = 30.0) -> Any:
        return await super().connect(timeout)

    async def disconnect(self, code: int = 1000, timeout: float = 30.0) -> None:
        await super().disconnect(code, timeout)


def socket(run_id: int, client: Client | None, query: str = "") -> Socket:
    headers = [(b"origin", b"http://127.0.0.1"), (b"host", b"127.0.0.1")]
    if client is not None:
        headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}".encode()))
    return Socket(application, f"/ws/runs/{run_id}/" + (f"?{query}" if query else ""), headers=headers)


async def receive_all(ws: WebsocketCommunicator, timeout: float = 0.2, *, first: float = 0.2) -> list[dict[str, Any]]:
    """Every message the socket sends until it has been quiet for `timeout` seconds: only for a
    check that expects nothing (`== []`), which a slow machine cannot fail. A check that expects
    messages waits for the one it needs (`receive_until`): the consumer sends on its own schedule,
    and a quiet period on a busy machine would cut its messages in two."""
    out = []
    while not await ws.receive_nothing(timeout=first if not out else timeout):
        out.append(await ws.receive_json_from())
    return out


def final_metrics(message: dict[str, Any]) -> bool:
    """The last part of a metrics message (a live step, or a backlog's or a catch-up's last part)."""
    return message["t"] == "metrics" and bool(message.get("final"))


async def receive_until(ws: WebsocketCommunicator, last: str | Callable[[dict[str, Any]], bool],
                        first: float = 30.0) -> list[dict[str, Any]]:
    """The messages the socket sends up to and including the first that is `last` (a message type,
    or a test of the message): the event the test waits for. Each wait is bounded by `first`
    seconds, a safety net for a hang, never a guess at how long the consumer takes."""
    done = (lambda m: m["t"] == last) if isinstance(last, str) else last
    out: list[dict[str, Any]] = []
    while not out or not done(out[-1]):
        out.append(await ws.receive_json_from(timeout=first))
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
