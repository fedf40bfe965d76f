"""DatabaseSink: the web's `training.events.EventSink`. Every write the trainer causes goes
through `DatabaseSink._write`: one transaction per event, the run's heartbeat bumped in it, and
`published(event, payload)` called after commit. Live streaming hooks in there (publish the
payload to the run's channel-layer group) without touching the trainer or the writes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.db import transaction
from django.utils import timezone

from training.events import StepMetrics, summary
from webapp.core.values import storable
from webapp.models import Checkpoint, Evaluation, EvaluationEpisode, LogLine, MetricPoint, Rollout, Run
from webapp.runs.publish import publish

WORKER_SHUTTING_DOWN = threading.Event()
"""Set by the Celery worker's shutdown signal (webapp.celery): running runs stop at the next step."""


class DatabaseSink:
    def __init__(self, run: Run):
        self.run_id = run.pk
        self.stopped_by_shutdown = False
        self.phase = ""

    # -- the EventSink protocol ----------------------------------------------------------------

    def run_started(self, *, total_steps: int, start_step: int) -> None:
        self._write("run_started", {"total_steps": total_steps, "step": start_step},
                    run_fields={"total_steps": total_steps, "step": start_step})

    def metrics(self, m: StepMetrics) -> None:
        values, agents = storable(m.values), storable(m.agents)
        point = {"step": m.step, "total_steps": m.total_steps, "values": values, "agents": agents, "time": m.time}

        def write() -> None:
            MetricPoint.objects.bulk_create(
                [MetricPoint(run_id=self.run_id, step=m.step, values=values, agents=agents, time=_from_epoch(m.time))],
                update_conflicts=True, unique_fields=["run", "step"], update_fields=["values", "agents", "time"],
            )

        # final_metrics always holds the latest step's values, so the history sorts running runs too.
        self._write("metrics", point, write, run_fields={"step": m.step, "total_steps": m.total_steps, "final_metrics": values})
        self.log(step_line(m))

    def rollouts(self, step: int, episodes: list[dict[str, Any]]) -> None:
        rows = [
            Rollout.played(ep, run_id=self.run_id, step=step, episode=i)
            for i, ep in enumerate(episodes)
        ]
        summary = {"step": step, "episodes": len(rows), "success": sum(r.success for r in rows)}

        def write() -> None:
            created = Rollout.objects.bulk_create(rows)
            ids = [r.pk for r in created if r.pk is not None]
            if ids:
                summary["last_id"] = max(ids)  # the live page fetches the episodes it lacks by id

        self._write("rollouts", summary, write)

    def log(self, message: str, *, level: str = "info") -> None:
        line = LogLine(run_id=self.run_id, level=level[:10], message=storable(message))
        self._write("log", {"level": level, "message": message}, line.save)

    def checkpoint(self, step: int, path: str) -> None:
        """Record the new checkpoint, and the older ones whose folders the engine just deleted
        (`checkpoint.keep`): their rows stay, marked deleted, and no page links to them any more."""
        gone: list[int] = []

        def write() -> None:
            Checkpoint.objects.update_or_create(run_id=self.run_id, step=step, defaults={"path": path, "deleted": None})
            for old in Checkpoint.objects.kept().filter(run_id=self.run_id).exclude(step=step):
                if not Path(old.path).is_dir():
                    gone.append(old.step)
            Checkpoint.objects.filter(run_id=self.run_id, step__in=gone).update(deleted=timezone.now())

        self._write("checkpoint", {"step": step, "path": path}, write)
        self.log(f"checkpoint saved at step {step}: {path}"
                 + (f"; deleted step {', '.join(map(str, gone))} (checkpoint.keep)" if gone else ""))

    def evaluation(self, result: dict[str, Any]) -> None:
        """The evaluation's numbers on one row, each episode it played on its own (`EvaluationEpisode`:
        the run page links them), written together."""
        row = Evaluation(
            run_id=self.run_id, step=int(result.get("step", 0)), temperature=float(result.get("temperature", 0.0)),
            team_success=float(result.get("team", {}).get("success", 0.0)), agents=storable(result.get("agents", {})),
            data=storable(summary(result)),
        )
        episodes = [ep for ep in result.get("episodes") or [] if isinstance(ep, dict)]

        def write() -> None:
            row.save()
            EvaluationEpisode.objects.bulk_create(
                EvaluationEpisode.played(ep, evaluation=row, episode=i)
                for i, ep in enumerate(episodes))

        self._write("evaluation", row.data, write)
        self.log(evaluation_line(result))

    def status(self, phase: str, detail: str, *, progress: float | None = None, eta: float | None = None) -> None:
        """Kept on the run (a page opened later shows it) and published; a new phase other than
        the next training step is also a log line (the step's own line says it finished)."""
        finish = time.time() + eta if eta is not None and math.isfinite(eta) else None
        fields = {"phase": phase[:20], "phase_detail": storable(detail)[:300], "eta": _from_epoch(finish) if finish else None,
                  "phase_progress": min(1.0, max(0.0, progress)) if progress is not None and math.isfinite(progress) else None}
        payload = {"phase": fields["phase"], "detail": fields["phase_detail"], "progress": fields["phase_progress"], "eta": finish}
        self._write("phase", payload, run_fields=fields, only_running=True)
        if phase != self.phase and phase != "training":
            self.log(detail)
        self.phase = phase

    def placed(self, where: dict[str, Any]) -> None:
        """Where the run's ranks live (the Ray nodes its cluster granted): kept on the run for its page
        and the workers page, and published."""
        self._write("placed", storable(where), run_fields={"cluster": storable(where)})

    def plan(self, plan: dict[str, Any]) -> None:
        """How the run executes (`training.plan.Plan.to_dict`): kept on the run for its page, and published."""
        self._write("plan", {"summary": storable(plan.get("summary", ""))}, run_fields={"plan": storable(plan)})

    def should_stop(self) -> bool:
        """Polled once per step: the user's cancel flag, this worker shutting down, or the run no
        longer running (a sweep marked it lost while this process was frozen or cut off)."""
        cancel, status = Run.objects.filter(pk=self.run_id).values_list("cancel_requested", "status").first() or (False, None)
        Run.objects.filter(pk=self.run_id).update(heartbeat=timezone.now())
        if WORKER_SHUTTING_DOWN.is_set() and not cancel:
            self.stopped_by_shutdown = True
            return True
        return bool(cancel) or status != Run.Status.RUNNING

    # -- the run's end (not a trainer event, but the same write path) ----------------------------

    def finish(self, *, status: str, step: int | None = None, final_metrics: dict[str, float] | None = None,
               error: str = "", traceback: str = "") -> None:
        fields: dict[str, Any] = {
            "status": status, "finished": timezone.now(), "error_message": storable(error), "traceback": storable(traceback),
            "phase": "", "phase_detail": "", "phase_progress": None, "eta": None,
        }
        if step is not None:
            fields["step"] = step
        if final_metrics is not None:
            fields["final_metrics"] = storable(final_metrics)
        # Only a running run is finished here: one a sweep already marked lost keeps that outcome.
        self._write("finished", {"status": status, "step": step, "error": error}, run_fields=fields, only_running=True)

    # -- the one place that writes -------------------------------------------------------------

    def _write(self, event: str, payload: dict[str, Any], write: Callable[[], Any] | None = None,
               *, run_fields: dict[str, Any] | None = None, only_running: bool = False) -> None:
        with transaction.atomic():
            if write is not None:
                write()
            rows = Run.objects.filter(pk=self.run_id)
            if only_running:
                rows = rows.filter(status=Run.Status.RUNNING)
            rows.update(heartbeat=timezone.now(), **(run_fields or {}))
            transaction.on_commit(lambda: self.published(event, payload))

    def published(self, event: str, payload: dict[str, Any]) -> None:
        """Called after each write commits: notify the run's live viewers (never raises)."""
        publish(run_id=self.run_id, event=event, payload=payload)


def step_line(m: StepMetrics) -> str:
    """The run log's line for a finished step: "step 3/50: reward +0.250, success 0.40, 12.3 s"."""
    v = m.values
    parts = [f"step {m.step}/{m.total_steps}:"]
    for key, label, fmt in (("reward/total", "reward", "+.3f"), ("success", "success", ".2f")):
        if isinstance(v.get(key), (int, float)) and math.isfinite(v[key]):
            parts.append(f"{label} {v[key]:{fmt}},")
    if isinstance(v.get("step_time"), (int, float)) and math.isfinite(v["step_time"]):
        parts.append(f"{v['step_time']:.1f} s")
    return " ".join(parts).rstrip(",")


def evaluation_line(result: dict[str, Any]) -> str:
    """"held-out at step 10 (greedy, 100 tasks): team success 0.420 · tool 0.50 · reasoner 0.38" ("temperature 1"
    where sampled, not a bare "T=1")."""
    agents = " · ".join(f"{name} {a.get('success', 0):.2f}" for name, a in (result.get("agents") or {}).items() if isinstance(a, dict))
    team = (result.get("team") or {}).get("success", 0.0)
    temperature = result.get("temperature", 0) or 0
    decoding = f"temperature {temperature:g}" if temperature else "greedy"
    return (f"held-out at step {result.get('step', 0)} ({decoding}, {result.get('n', 0)} tasks): "
            f"team success {team:.3f}" + (f" · {agents}" if agents else ""))


def _from_epoch(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)
