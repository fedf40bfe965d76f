"""Live run streaming, viewer side: what a viewer's websocket receives.

The database is the source of truth; the channel layer only carries small notifications, which the
worker sends after each commit (`webapp.runs.publish`). Each socket keeps a `StreamCursor` (last
step, log line and episode it has sent) and reads anything after it from the database at the next
notification, at the page's next ping (every 25 s), or when the page reconnects stating what it
has (`?step=&log=`).

`stream_open()` builds the backlog for a new socket and `stream_event()` turns one group message
into messages for one socket. Messages to the browser are JSON with a `t` key:

- `status`:  `{status, label, step, total, started, finished, error, cancel_requested, phase, detail,
              progress, eta}` (times in epoch seconds; `eta` is when the engine expects the run to end)
- `phase`:   `{phase, detail, progress, eta}`: what the running engine is doing now (`EventSink.status`)
- `metrics`: the charted series (`webapp.runs.series`). A backlog comes as several such messages
             (`split_metrics`, none near Daphne's 1 MiB frame limit); a live step is the same shape
             with one point per series.
- `evals`:   `{rows: [{step, temperature, n, team, agents: {name: {success, reward}}}]}`
- `rollouts`: `{last_id}`: the newest episode's id. The page fetches the episodes it lacks over
              HTTP (`webapp.runs.rollouts`), so episodes of any size never go through the websocket.
- `log`:     `{lines: [{id, time, level, message}], reset}` (the backlog's log is its last message)
- `checkpoint`: `{step, path}`
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async

from webapp.models import Evaluation, LogLine, Rollout, Run
from webapp.runs.selectors import run_viewable
from webapp.runs.series import finite, metrics_delta, metrics_message, split_metrics

LOG_TAIL = 200
"""Log lines sent on connect (the page keeps at most a few hundred)."""

EVALS_MAX = 2000
"""Most evaluation rows sent on connect (the newest)."""

LOG_LINE_CHARS = 2000
"""Longer log lines are cut in the live tail (the database keeps them whole)."""


# == who, where from ==============================================================================


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


# == messages =====================================================================================


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
            return [metrics_delta(payload)]
    if event == "rollouts" and payload.get("last_id"):
        cursor.rollout = max(cursor.rollout or 0, int(payload["last_id"]))
        return [{"t": "rollouts", "last_id": cursor.rollout}]
    if event == "evaluation" and "team" in payload:
        return [{"t": "evals", "rows": [_eval_row(payload)]}]
    if event == "checkpoint":
        return [{"t": "checkpoint", "step": payload.get("step"), "path": payload.get("path")}]
    if event == "placed":  # the Ray nodes a run on several hosts was granted: the page's Hosts line
        return [{"t": "placed"}]
    if event == "plan":  # how the run executes, resolved at its start: the page's Execution line
        return [{"t": "plan"}]
    if event == "phase" and "phase" in payload:
        cursor.phase = (str(payload.get("phase") or ""), str(payload.get("detail") or ""))
        return [{"t": "phase", "phase": cursor.phase[0], "detail": cursor.phase[1], "progress": finite(payload.get("progress")),
                 "eta": finite(payload.get("eta"))}]
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
        "worker": run.worker,
        "phase": run.phase,
        "detail": run.phase_detail,
        "progress": run.phase_progress,
        "eta": run.eta.timestamp() if run.eta else None,
    }


# -- evaluations ----------------------------------------------------------------------------------


def _eval_data(e: Evaluation) -> dict[str, Any]:
    return {"step": e.step, "temperature": e.temperature, "team": {"success": e.team_success}, "agents": e.agents}


def _eval_row(result: Mapping[str, Any]) -> dict[str, Any]:
    agents = result.get("agents") or {}
    return {
        "step": int(result.get("step", 0)),
        "temperature": finite(result.get("temperature", 0.0)) or 0.0,
        "n": result.get("n"),
        "team": finite((result.get("team") or {}).get("success")),
        "agents": {
            name: {"success": finite(v.get("success")), "reward": finite(v.get("reward"))}
            for name, v in agents.items() if isinstance(v, Mapping)
        },
    }


# -- rollouts and log -----------------------------------------------------------------------------


def _rollouts_note(cursor: StreamCursor) -> dict[str, Any]:
    """The newest episode's id: the page fetches what it lacks over HTTP (runs/_episodes.html,
    filtered on the server), so episodes of any size never go through the websocket."""
    newest = Rollout.objects.filter(run_id=cursor.run_id).order_by("-id").values_list("id", flat=True).first()
    if newest is not None:
        cursor.rollout = max(cursor.rollout or 0, newest)
    return {"t": "rollouts", "last_id": cursor.rollout}


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


def _log_line(line: Mapping[str, Any]) -> dict[str, Any]:
    when: datetime = line["time"]
    message = line["message"]
    if len(message) > LOG_LINE_CHARS:
        message = message[:LOG_LINE_CHARS] + f" … ({len(message) - LOG_LINE_CHARS} more characters)"
    return {"id": line["id"], "time": when.timestamp(), "level": line["level"], "message": message}
