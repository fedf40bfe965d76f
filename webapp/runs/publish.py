"""Worker side of live streaming: after each write commits, `DatabaseSink` calls `publish()`.

The group message is `{"type": "run.event", "event": <sink event>, "payload": <small dict>}` on
group `run-<id>`: `metrics` carries the step's numbers (a few KB), `rollouts` only `{step,
episodes, success, last_id}`, `log` only the level, `evaluation` the result without its episodes.
A payload over `MAX_PAYLOAD_BYTES` is replaced by a stub, and the consumer reads the rows instead.
A dropped message (Redis down, channel over capacity, expiry) costs nothing permanent: the viewer
side (`webapp.runs.streaming`) reads anything after its cursor from the database.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

MAX_PAYLOAD_BYTES = 64 * 1024
"""A group message above this is replaced by a stub; the consumer reads the rows instead."""

PUBLISH_BACKOFF_S = 10.0
"""After a failed publish the sink stays quiet this long, so a dead Redis never slows training."""


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


_quiet_until = 0.0
_quiet_lock = threading.Lock()


def publish(*, run_id: int, event: str, payload: Mapping[str, Any]) -> None:
    """Notify the run's viewers. Never raises: the row is already committed, and viewers catch
    up from the database. Called by `DatabaseSink` after each commit (once per step for metrics,
    once per step's batch of rollouts)."""
    global _quiet_until
    layer = get_channel_layer()
    if layer is None or time.monotonic() < _quiet_until:
        return
    body: Mapping[str, Any] = payload
    if len(json.dumps(payload, default=str)) > MAX_PAYLOAD_BYTES:
        body = {"step": payload.get("step"), "too_big": True}
    try:
        async_to_sync(layer.group_send)(run_group(run_id), {"type": "run.event", "event": event, "payload": dict(body)})
    except Exception as exc:  # noqa: BLE001 (any channel-layer failure: the viewers catch up from the database)
        with _quiet_lock:
            _quiet_until = time.monotonic() + PUBLISH_BACKOFF_S
        log.warning("run %s: could not publish %s to the channel layer (%s); quiet for %.0fs", run_id, event, exc, PUBLISH_BACKOFF_S)
