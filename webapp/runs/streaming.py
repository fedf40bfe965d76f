"""Live run streaming: what the worker publishes, and what a viewer's websocket receives.

The database is the source of truth; the channel layer only carries small notifications.

Worker side. `DatabaseSink` calls `publish()` after each write commits. The group message is
`{"type": "run.event", "event": <sink event>, "payload": <small dict>}` on group `run-<id>`:
`metrics` carries the step's numbers (a few KB), `rollouts` only `{step, episodes, success,
last_id}`, `log` only the level, `evaluation` the result without its examples. A payload over
`MAX_PAYLOAD_BYTES` is replaced by a stub, and the consumer reads the rows instead. A dropped
message (Redis down, channel over capacity, expiry) costs nothing permanent: each socket keeps a
`StreamCursor` (last step, log line and episode it has sent) and reads anything after it from the
database at the next notification, at the page's next ping (every 25 s), or when the page
reconnects stating what it has (`?step=&log=`).

Viewer side. `stream_open()` builds the backlog for a new socket and `stream_event()` turns one
group message into messages for one socket. Messages to the browser are JSON with a `t` key:

- `status`:  `{status, label, step, total, started, finished, error, cancel_requested, phase, detail,
              progress, eta}` (times in epoch seconds; `eta` is when the engine expects the run to end)
- `phase`:   `{phase, detail, progress, eta}`: what the running engine is doing now (`EventSink.status`)
- `metrics`: `{last, total, downsampled, run: {key: [[steps], [values]]},
              agents: {agent: {key: [[steps], [values]]}}, times: [[steps], [epoch]]}`
             A backlog comes as several such messages (`split_metrics`, none near Daphne's 1 MiB
             frame limit); a live step is the same shape with one point per series. Only the
             charted series (`RUN_SERIES`, `REWARD_FN_PREFIX`, `AGENT_SERIES`) travel; values are null when
             not finite.
- `evals`:   `{rows: [{step, temperature, n, team, agents: {name: {success, reward}}}]}`
- `rollouts`: `{last_id}`: the newest episode's id. The page fetches the episodes it lacks over
              HTTP (`runs/<id>/rollouts/?after=<id>` + its filter, rendered `runs/_episodes.html`),
              so episodes of any size never go through the websocket.
- `log`:     `{lines: [{id, time, level, message}], reset}` (the backlog's log is its last message)
- `checkpoint`: `{step, path}`

Long series are downsampled on the server (min-max per bucket, first and last point kept) to at
most `MAX_POINTS` points each, so a 10,000-step run loads about as fast as a 2,000-step one.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import numpy as np
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import connections
from django.db.models import F, Func, Q, TextField, Value
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast
from django.utils import timezone

from webapp.core.series import downsample_minmax
from webapp.models import Evaluation, LogLine, MetricPoint, Rollout, Run

log = logging.getLogger(__name__)


MAX_POINTS = 2000


"""Most points per series in a backlog (the chart cannot show more on a laptop screen anyway)."""


EPISODES_PAGE = 20


"""Episodes sent on connect and per "load older" request."""


LOG_TAIL = 200


"""Log lines sent on connect (the page keeps at most a few hundred)."""


EVALS_MAX = 2000


TIMES_TAIL = 50


"""(step, wall time) pairs sent with a backlog, for the page's ETA."""


MAX_PAYLOAD_BYTES = 64 * 1024


"""A group message above this is replaced by a stub; the consumer reads the rows instead."""


PUBLISH_BACKOFF_S = 10.0


"""After a failed publish the sink stays quiet this long, so a dead Redis never slows training."""


TERMINAL = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED)


def run_group(run_id: int) -> str:
    return f"run-{run_id}"


# == worker side ==================================================================================

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


# == viewer side: who, where from ==================================================================


def run_viewable(*, user: Any, run_id: int) -> bool:
    """A logged-in member of the run's team (the same rule as the pages)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    return Run.objects.filter(pk=run_id, team__memberships__user=user).exists()


def _read(fn: Any) -> Any:
    """Run read-only ORM work off the event loop in a thread pool, not in the single thread that
    Django's ASGI handler shares among all sync views and middleware: a 10,000-step backlog must
    not hold up every page and static file this Daphne serves meanwhile."""
    return database_sync_to_async(fn, thread_sensitive=False)


async def run_viewable_async(*, user: Any, run_id: int) -> bool:
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    return await _read(run_viewable)(user=user, run_id=run_id)


@dataclass
class StreamCursor:
    """What one socket has already sent (or what the browser says it has, on reconnect)."""

    run_id: int
    step: int | None = None
    """Last metrics step; None: the page has no metrics yet."""
    rollout: int | None = None
    """Newest Rollout id announced."""
    log: int | None = None
    """Highest LogLine id sent."""
    status: str | None = None
    """Last status sent."""
    phase: tuple[str, str] | None = None
    """Last (phase, detail) sent."""

    @classmethod
    def from_query_string(cls, run_id: int, query_string: bytes | str) -> StreamCursor:
        """`?step=12&log=77` from a reconnecting page; anything else is ignored."""
        raw = query_string.decode("latin-1") if isinstance(query_string, bytes) else query_string
        params = parse_qs(raw)

        def number(name: str) -> int | None:
            value = (params.get(name) or [""])[0]
            return int(value) if value.isascii() and value.isdigit() and len(value) < 12 else None

        return cls(run_id=run_id, step=number("step"), rollout=number("rollout"), log=number("log"))


# == viewer side: messages ========================================================================


async def stream_open(*, cursor: StreamCursor) -> AsyncIterator[dict[str, Any]]:
    """Everything a socket needs first, as soon as each part is read: status; metrics after
    `cursor.step` (all of them on a first connect, downsampled), run-wide series first so the
    first charts draw while the per-agent ones are read; evaluations; the newest episode's id;
    the log tail after `cursor.log` (last: the page then knows the backlog is complete). Advances
    the cursor to what the database holds now."""
    since = cursor.step
    status = await _read(_open_status)(cursor)
    yield status
    run_wide = await _read(metrics_message)(run_id=cursor.run_id, since=since, total=status["total"], per_agent=False)
    for part in split_metrics(run_wide, final=run_wide["last"] is None):
        yield part
    if run_wide["last"] is not None:
        # The same steps as the run-wide part: a step committed meanwhile comes as a live delta.
        per_agent = await _read(metrics_message)(run_id=cursor.run_id, since=since, until=run_wide["last"],
                                                 total=status["total"], run_wide=False)
        per_agent["times"] = [[], []]  # sent with the run-wide part
        for part in split_metrics(per_agent):
            yield part
        cursor.step = run_wide["last"]
    for message in await _read(_backlog_rest)(cursor, since):
        yield message


async def stream_event(*, cursor: StreamCursor, event: str, payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One group message -> the messages this socket should send. Metrics that follow the
    cursor's step are forwarded as they are; anything else (a gap, log lines, status) is read
    from the database after the cursor. `heartbeat` (the page's ping) checks everything, so even
    a socket whose group membership was lost (Redis restarted) keeps up."""
    if event == "metrics" and "values" in payload and cursor.status == Run.Status.RUNNING:
        step = int(payload["step"])
        if cursor.step is not None and step <= cursor.step:
            return []  # already sent (the backlog raced this message)
        if cursor.step is None or step == cursor.step + 1:
            cursor.step = step
            return [_metrics_delta(payload)]
    if event == "rollouts" and payload.get("last_id"):
        cursor.rollout = max(cursor.rollout or 0, int(payload["last_id"]))
        return [{"t": "rollouts", "last_id": cursor.rollout}]
    if event == "evaluation" and "team" in payload:
        return [{"t": "evals", "rows": [_eval_row(payload)]}]
    if event == "checkpoint":
        return [{"t": "checkpoint", "step": payload.get("step"), "path": payload.get("path")}]
    if event == "phase" and "phase" in payload:
        cursor.phase = (str(payload.get("phase") or ""), str(payload.get("detail") or ""))
        return [{"t": "phase", "phase": cursor.phase[0], "detail": cursor.phase[1], "progress": _finite(payload.get("progress")),
                 "eta": _finite(payload.get("eta"))}]
    return await _read(_catch_up)(cursor, event)


def _open_status(cursor: StreamCursor) -> dict[str, Any]:
    run = Run.objects.get(pk=cursor.run_id)
    cursor.status, cursor.phase = run.status, (run.phase, run.phase_detail)
    return status_message(run)


def _backlog_rest(cursor: StreamCursor, since: int | None) -> list[dict[str, Any]]:
    # Evaluations are few: all of them on a first connect; from the page's last step on (the
    # evaluation of that step may have been missed) on a reconnect. The page dedupes them.
    evals = Evaluation.objects.filter(run_id=cursor.run_id)
    if since is not None:
        evals = evals.filter(step__gte=since)
    eval_rows = [_eval_row(e.data or _eval_data(e)) for e in evals.order_by("-step", "-temperature")[:EVALS_MAX]][::-1]
    return [
        {"t": "evals", "rows": eval_rows},
        _rollouts_note(cursor),
        _log_after(cursor, first=True),  # last: the page knows the backlog is complete
    ]


def _catch_up(cursor: StreamCursor, event: str) -> list[dict[str, Any]]:
    run = Run.objects.filter(pk=cursor.run_id).first()
    if run is None:
        return []
    everything = event in ("heartbeat", "finished")
    messages: list[dict[str, Any]] = []
    if run.status != cursor.status or event in ("run_started", "finished") or (everything and cursor.phase != (run.phase, run.phase_detail)):
        cursor.status, cursor.phase = run.status, (run.phase, run.phase_detail)
        messages.append(status_message(run))
    if everything or event in ("metrics", "run_started"):
        metrics = metrics_message(run_id=run.pk, since=cursor.step, total=run.total_steps)
        if metrics["last"] is not None:
            cursor.step = metrics["last"]
            messages += split_metrics(metrics)
    if everything or event == "rollouts":
        seen = cursor.rollout
        note = _rollouts_note(cursor)
        if note["last_id"] is not None and note["last_id"] != seen:
            messages.append(note)
    if everything or event in ("log", "run_started"):
        lines = _log_after(cursor, first=False)
        if lines["lines"]:
            messages.append(lines)
    return messages


def status_message(run: Run) -> dict[str, Any]:
    return {
        "t": "status",
        "status": run.status,
        "label": run.get_status_display(),
        "step": run.step,
        "total": run.total_steps,
        "started": run.started.timestamp() if run.started else None,
        "finished": run.finished.timestamp() if run.finished else None,
        "error": run.error_message,
        "cancel_requested": run.cancel_requested,
        "phase": run.phase,
        "detail": run.phase_detail,
        "progress": run.phase_progress,
        "eta": run.eta.timestamp() if run.eta else None,
    }


# -- metrics --------------------------------------------------------------------------------------


RUN_SERIES = ("reward/total", "reward/team", "reward/local", "success", "completion_len", "step_time", "rollout_time",
              "update_time", "tokens_per_s", "zero_std_frac", "tool_calls", "tool_errors", "dynamic/extra_batches",
              "dynamic/signal_tasks", "loss", "token_accuracy")


"""Run-wide metrics the page charts (and so streams; `tool_*` only runs whose agents call tools have,
`dynamic/*` only runs with `grpo.dynamic_sampling`, `loss` and `token_accuracy` only SFT runs); the summary card's table shows them all."""


REWARD_FN_PREFIX = "reward/fn/"


"""Run-wide series for each of the run's reward functions (`data.reward_fn`, `data.reward_fns`;
their means before the weights), charted together; which there are comes from the run's points."""


AGENT_SERIES = ("reward/total", "reward/team", "reward/local", "success", "loss", "kl", "entropy", "clip_region",
                "clip_low", "clip_high", "completion_len", "ended", "zero_std_frac", "adv/mean", "adv/std",
                "mismatch/logp_diff", "mismatch/capped", "token_accuracy")


"""Per-agent metrics the page charts (`mismatch/*`: vLLM's log-probs against the trainer's, see
`training.grpo.sampler_mismatch`; only runs that sample with vLLM have them)."""


def metrics_message(*, run_id: int, since: int | None = None, until: int | None = None, total: int = 0,
                    max_points: int = MAX_POINTS, run_wide: bool = True, per_agent: bool = True) -> dict[str, Any]:
    """The charted series of a run for steps in (`since`, `until`], each downsampled to
    `max_points`; the run-wide ones, the per-agent ones, or both. A resumed run's series start
    with its ancestors' points up to the resumed step (`Run.metric_lineage`); the ETA's times
    are the run's own.

    The database pulls the charted numbers out of the JSON columns (`_series_table`), so a
    10,000-step run costs one query and one numpy parse, not 20,000 json.loads."""
    run = Run.objects.filter(pk=run_id).only("pk", "resumed_from_id", "resumed_at_step", "config_yaml").first()
    rows = MetricPoint.objects.filter(run.metric_lineage() if run is not None else Q(run_id=run_id))
    if since is not None:
        rows = rows.filter(step__gt=since)
    if until is not None:
        rows = rows.filter(step__lte=until)
    columns: list[tuple[str | None, str]] = [(None, key) for key in RUN_SERIES + _reward_fn_keys(rows)] if run_wide else []
    if per_agent:
        columns += [(agent, key) for agent in _agent_names(run, rows) for key in AGENT_SERIES]
    table = _series_table(rows, columns)  # (N, 1 + C)
    steps = table[:, 0].astype(np.int64) if len(table) else np.zeros(0, dtype=np.int64)  # (N,)
    downsampled = False
    run_series: dict[str, list[list[Any]]] = {}
    agent_series: dict[str, dict[str, list[list[Any]]]] = {}
    for i, (agent, key) in enumerate(columns, start=1):
        values = table[:, i] if len(table) else np.zeros(0)  # (N,)
        present = np.isfinite(values)  # (N,) missing, null (a NaN the sink stored) and inf are no points
        xs, ys = steps[present], values[present]  # (n,)
        if not len(xs):
            continue
        if len(xs) > max_points:
            downsampled = True
            keep = downsample_minmax(ys, max_points)
            xs, ys = xs[keep], ys[keep]
        (run_series if agent is None else agent_series.setdefault(agent, {}))[key] = [xs.tolist(), _round(ys)]
    own = MetricPoint.objects.filter(run_id=run_id)
    if since is not None:
        own = own.filter(step__gt=since)
    if until is not None:
        own = own.filter(step__lte=until)
    recent = list(own.order_by("-step").values_list("step", "time")[:TIMES_TAIL])[::-1]
    return {
        "t": "metrics",
        "last": int(steps[-1]) if len(steps) else None,
        "total": total,
        "downsampled": downsampled,
        "run": run_series,
        "agents": agent_series,
        "times": [[s for s, _ in recent], [t.timestamp() for _, t in recent]],
    }


def _series_table(rows: Any, columns: list[tuple[str | None, str]]) -> np.ndarray:
    """Step and one float column per (agent or None for run-wide, key), in step order; NaN where
    a point lacks the key or holds something else than a number.

    The database pulls each group's numbers (run-wide; each agent's) out of the JSON column as one
    small JSON array per row (SQLite: one JSON_EXTRACT with every path, so the row's text is
    parsed once, not once per key; PostgreSQL: jsonb_build_array of the keys), and numpy parses
    all those arrays at once."""
    if not columns:
        steps = list(rows.order_by("step").values_list("step", flat=True))
        return np.array(steps, dtype=np.float64).reshape(-1, 1)
    sqlite = connections[rows.db].vendor == "sqlite"
    groups: dict[str | None, list[str]] = {}
    for agent, key in columns:
        groups.setdefault(agent, []).append(key)
    exprs: dict[str, Any] = {}
    widths: list[int] = []
    for i, (agent, keys) in enumerate(groups.items()):
        field = "values" if agent is None else "agents"
        if sqlite:
            # Two paths at least, so SQLite answers with a JSON array (one path gives the bare value).
            paths = [_json_path(*([agent] if agent else []), key) for key in keys] + ["$.__pad__"]
            exprs[f"g{i}"] = Func(F(field), *[Value(p) for p in paths], function="JSON_EXTRACT", output_field=TextField())
        else:
            source: Any = field if agent is None else KeyTransform(agent, field)
            exprs[f"g{i}"] = Cast(Func(*[KeyTransform(key, source) for key in keys], function="JSONB_BUILD_ARRAY"), TextField())
        widths.append(len(keys) + (1 if sqlite else 0))
    data = list(rows.annotate(**exprs).order_by("step").values_list("step", *exprs))
    blocks = [np.array([row[0] for row in data], dtype=np.float64).reshape(-1, 1)]  # (N, 1)
    for j, (keys, width) in enumerate(zip(groups.values(), widths), start=1):
        blocks.append(_json_arrays([row[j] for row in data], width)[:, : len(keys)])  # (N, keys)
    return np.hstack(blocks)


def _json_arrays(texts: list[str | None], width: int) -> np.ndarray:
    """Rows of JSON number arrays (`[1.5,null,2]`, each `width` long) as an (N, width) float
    matrix, null -> NaN. One C-level parse of all of them; a row holding anything but numbers
    and nulls (a string or a boolean someone logged) sends the lot through json.loads instead."""
    if texts and all(texts):
        try:
            flat = np.fromstring(",".join(t[1:-1] for t in texts if t).replace("null", "nan"), sep=",")  # (N*width,)
            if flat.size == len(texts) * width:
                return flat.reshape(len(texts), width)
        except ValueError:
            pass
    rows = [json.loads(t) if t else [None] * width for t in texts]
    return np.array([[v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in row[:width]]
                     + [None] * (width - len(row)) for row in rows], dtype=np.float64).reshape(len(texts), width)


def _json_path(*keys: str) -> str:
    return "$" + "".join("." + json.dumps(key) for key in keys)


CHUNK_POINTS = 20_000


"""Most points in one websocket message (~0.4 MB of JSON; Daphne refuses messages over 1 MiB)."""


def split_metrics(message: dict[str, Any], chunk_points: int = CHUNK_POINTS, *, final: bool = True) -> list[dict[str, Any]]:
    """A metrics message as several, none above `chunk_points` points: whole series per message,
    the run-wide ones first; the times ride with the first. Each merges on its own on the page;
    only the last carries `final` (when `final`), and only a final message moves the page's
    reconnect cursor, so a socket that drops mid-way asks for the same steps again."""
    parts: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    size = 0

    def new() -> dict[str, Any]:
        part = {k: v for k, v in message.items() if k not in ("run", "agents", "times")}
        part.update(run={}, agents={}, times=[[], []] if parts else message["times"])
        parts.append(part)
        return part

    for agent, key, series in [(None, k, v) for k, v in message["run"].items()] + [
        (a, k, v) for a, cols in message["agents"].items() for k, v in cols.items()
    ]:
        if current is None or (size and size + len(series[0]) > chunk_points):
            current, size = new(), 0
        size += len(series[0])
        (current["run"] if agent is None else current["agents"].setdefault(agent, {}))[key] = series
    parts = parts or [dict(message)]
    for i, part in enumerate(parts):
        part["final"] = final and i == len(parts) - 1
    return parts


def _round(values: np.ndarray) -> list[float]:
    """Six significant digits: plenty for a chart, and half the JSON of full float reprs."""
    return [float(f"{v:.6g}") for v in values.tolist()]


def _agent_names(run: Run | None, rows: Any) -> list[str]:
    """The run's agents in acting order (its config), then any other agent its points name."""
    names: list[str] = []
    if run is not None:
        try:
            names = [a.name for a in run.to_config().topology.agents]
        except (ValueError, TypeError, AttributeError):
            names = []
    for ordering in ("step", "-step"):
        for agents in rows.order_by(ordering).values_list("agents", flat=True)[:1]:
            names += [name for name in (agents or {}) if name not in names]
    return names


def _reward_fn_keys(rows: Any) -> tuple[str, ...]:
    """The `reward/fn/<name>` keys of these points, from the first and the last (a run's reward
    functions are fixed by its config; a resumed run's lineage could differ at its ends)."""
    keys: set[str] = set()
    for ordering in ("step", "-step"):
        for values in rows.order_by(ordering).values_list("values", flat=True)[:1]:
            keys.update(k for k in (values or {}) if isinstance(k, str) and k.startswith(REWARD_FN_PREFIX))
    return tuple(sorted(keys))


def _metrics_delta(payload: Mapping[str, Any]) -> dict[str, Any]:
    step = int(payload["step"])

    def one(values: Mapping[str, Any] | None, keys: tuple[str, ...], prefix: str | None = None) -> dict[str, list[list[Any]]]:
        return {
            k: [[step], [_finite(v)]] for k, v in (values or {}).items()
            if (k in keys or (prefix and isinstance(k, str) and k.startswith(prefix)))
            and isinstance(v, (int, float)) and not isinstance(v, bool)
        }

    return {
        "t": "metrics",
        "last": step,
        "total": payload.get("total_steps"),
        "downsampled": False,
        "run": one(payload.get("values"), RUN_SERIES, REWARD_FN_PREFIX),
        "agents": {name: one(v, AGENT_SERIES) for name, v in (payload.get("agents") or {}).items()},
        "times": [[step], [payload.get("time")]],
        "final": True,
    }


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# -- evaluations ------------------------------------------------------------------------------------


def _eval_data(e: Evaluation) -> dict[str, Any]:
    return {"step": e.step, "temperature": e.temperature, "team": {"success": e.team_success}, "agents": e.agents}


def _eval_row(result: Mapping[str, Any]) -> dict[str, Any]:
    agents = result.get("agents") or {}
    return {
        "step": int(result.get("step", 0)),
        "temperature": _finite(result.get("temperature", 0.0)) or 0.0,
        "n": result.get("n"),
        "team": _finite((result.get("team") or {}).get("success")),
        "agents": {
            name: {"success": _finite(v.get("success")), "reward": _finite(v.get("reward"))}
            for name, v in agents.items() if isinstance(v, Mapping)
        },
    }


# -- rollouts -----------------------------------------------------------------------------------------

AGENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")


@dataclass(frozen=True)
class RolloutFilter:
    """The rollout viewer's filter: by agent (it acted in the episode), by success, by step."""

    agent: str = ""
    success: bool | None = None
    step: int | None = None

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> RolloutFilter:
        agent = query.get("agent", "")
        success = {"yes": True, "no": False}.get(query.get("success", ""))
        step = query.get("step", "").strip()
        return cls(
            agent=agent if AGENT_NAME.match(agent) else "",
            success=success,
            step=int(step) if step.isascii() and step.isdigit() and len(step) < 10 else None,
        )

    def apply(self, rows: Any) -> Any:
        if self.agent:
            # agent_names is a JSON list of names; names cannot hold quotes, so '"name"' matches one element.
            rows = rows.annotate(agents_text=Cast("agent_names", TextField())).filter(agents_text__contains=f'"{self.agent}"')
        if self.success is not None:
            rows = rows.filter(success=self.success)
        if self.step is not None:
            rows = rows.filter(step=self.step)
        return rows


def rollouts_page(*, run: Run, filters: RolloutFilter | None = None, before: int | None = None,
                  after: int | None = None, limit: int = EPISODES_PAGE) -> dict[str, Any]:
    """Newest episodes first (by id), `limit` of them: older than id `before` ("load older"), or
    newer than id `after` (the live page catching up; `more` then means a gap it cannot fill by
    prepending, and the page starts its list over with this answer). The context of
    `runs/_episodes.html`."""
    filters = filters or RolloutFilter()
    rows = filters.apply(Rollout.objects.filter(run_id=run.pk))
    if before is not None:
        rows = rows.filter(id__lt=before)
    if after is not None:
        rows = rows.filter(id__gt=after)
    page = list(rows.order_by("-id")[: limit + 1])
    return {"run": run, "episodes": [episode_view(r) for r in page[:limit]], "more": len(page) > limit,
            "filtered": filters != RolloutFilter(), "newest": page[0].pk if page else None}


@dataclass
class EpisodeView:
    """One Rollout row as the template shows it: turns with each candidate's index and `chosen`."""

    row: Rollout
    question: str
    task_id: str
    turns: list[dict[str, Any]]
    agents: str


def episode_view(r: Rollout) -> EpisodeView:
    data = r.data or {}
    turns = []
    for t in data.get("turns", []):
        chosen = t.get("chosen")
        cands = [dict(c, chosen=(i == chosen), index=i, calls=_calls_view(c.get("calls")), exchange=exchange_view(c))
                 for i, c in enumerate(t.get("candidates", []))]
        turns.append(dict(t, candidates=cands))
    return EpisodeView(row=r, question=str(data.get("question", "")), task_id=str(data.get("task_id", "")),
                       turns=turns, agents=" ".join(r.agent_names or []))


def _calls_view(calls: Any) -> list[dict[str, Any]]:
    """A candidate's tool calls (name, arguments, result, error) with the arguments as JSON text."""
    if not isinstance(calls, list):
        return []
    return [dict(call, arguments_text=json.dumps(call.get("arguments", {}), ensure_ascii=False))
            for call in calls if isinstance(call, dict)]


def exchange_view(candidate: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A tool turn in the order it happened: each segment the model wrote, then the call it made
    (the last segment has none). Empty for a candidate without calls, or one recorded before the
    segments were kept (its text and calls show apart)."""
    segments, calls = candidate.get("segments"), _calls_view(candidate.get("calls"))
    if not isinstance(segments, list) or not calls or len(segments) < len(calls):
        return []
    return [{"text": str(text), "call": calls[i] if i < len(calls) else None} for i, text in enumerate(segments)]


def _rollouts_note(cursor: StreamCursor) -> dict[str, Any]:
    """The newest episode's id: the page fetches what it lacks over HTTP (runs/_episodes.html,
    filtered on the server), so episodes of any size never go through the websocket."""
    newest = Rollout.objects.filter(run_id=cursor.run_id).order_by("-id").values_list("id", flat=True).first()
    if newest is not None:
        cursor.rollout = max(cursor.rollout or 0, newest)
    return {"t": "rollouts", "last_id": cursor.rollout}


# -- log ------------------------------------------------------------------------------------------------


def _log_after(cursor: StreamCursor, *, first: bool) -> dict[str, Any]:
    rows = LogLine.objects.filter(run_id=cursor.run_id)
    if cursor.log is not None:
        rows = rows.filter(id__gt=cursor.log)
    lines = list(rows.order_by("-id").values("id", "time", "level", "message")[: LOG_TAIL + 1])
    reset = first and cursor.log is None or len(lines) > LOG_TAIL
    lines = lines[:LOG_TAIL][::-1]
    if lines:
        cursor.log = lines[-1]["id"]
    return {"t": "log", "reset": reset, "lines": [_log_line(line) for line in lines]}


LOG_LINE_CHARS = 2000


"""Longer log lines are cut in the live tail (the database keeps them whole)."""


def _log_line(line: Mapping[str, Any]) -> dict[str, Any]:
    when: datetime = line["time"]
    message = line["message"]
    if len(message) > LOG_LINE_CHARS:
        message = message[:LOG_LINE_CHARS] + f" … ({len(message) - LOG_LINE_CHARS} more characters)"
    return {"id": line["id"], "time": when.timestamp(), "level": line["level"], "message": message}


# == the dashboard =================================================================================


def run_eta_seconds(run: Run, now: datetime | None = None) -> float | None:
    """Time left for a running run, by the engine's estimate (`Run.eta`: its own step,
    evaluation and checkpoint times); None while it cannot tell (before the first step)."""
    if run.status != Run.Status.RUNNING or run.eta is None:
        return None
    return max(0.0, (run.eta - (now or timezone.now())).total_seconds())
