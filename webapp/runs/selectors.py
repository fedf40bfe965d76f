"""The runs domain's reads: what the dashboard and the run page show, and who may watch a run live.

The queue's own reads (positions, what a queued run waits for) are in `webapp.runs.queue`; the
charted series in `webapp.runs.series`; the rollout viewer's pages in `webapp.runs.rollouts`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.models import QuerySet

from webapp.artifacts.selectors import run_artifacts_section
from webapp.history.selectors import held_out_of
from webapp.models import Agent, Checkpoint, Dataset, Evaluation, Job, Run, Team, Topology
from webapp.runs import queue
from webapp.runs.series import chart_specs


def dashboard_runs(*, team: Team) -> dict[str, Any]:
    """The dashboard: the team's active runs (running, then queued in queue order) with their
    places and holds, the ten latest finished ones, and how many of each object the team has."""
    runs = Run.objects.filter(team=team).select_related("owner", "topology")
    active = runs.filter(status__in=Run.ACTIVE).order_by("-status", *Run.QUEUE_ORDER)
    capped = queue.experiment_capped_teams()
    return {
        "active": active,
        "queue": queue.run_queue_positions(),
        "held": {run.pk for run in active if queue.run_is_held(run=run, capped=capped)},
        "recent": runs.exclude(status__in=Run.ACTIVE)[:10],
        "counts": {
            "agents": Agent.objects.filter(team=team).count(),
            "topologies": Topology.objects.filter(team=team).count(),
            "datasets": Dataset.objects.filter(team=team).count(),
            "runs": runs.count(),
        },
    }


def run_page_runs(*, team: Team) -> QuerySet[Run]:
    """The team's runs, with what the run page names of each."""
    return Run.objects.select_related("owner", "topology", "dataset", "resumed_from").filter(team=team)


def run_live_card(*, run: Run) -> dict[str, Any]:
    """The run page's live card as the page first draws it (the websocket keeps it current)."""
    return {
        "latest": run.metric_points.order_by("-step").first(),
        "checkpoints": run.checkpoints.kept(),
        "resume_point": run.resume_point() if run.can_resume else None,
        "log_lines": list(run.log_lines.order_by("-time", "-id")[:50])[::-1],
        "waiting_for": queue.run_waiting_for(run=run),
        "charts": chart_specs(),
    }


def run_conversations(*, run: Run) -> Dataset | None:
    """The team's conversations dataset an SFT run learns from (None for a GRPO run, or once it is deleted)."""
    if run.algorithm != "sft":
        return None
    try:
        path = run.to_config().sft.path
    except Exception:  # noqa: BLE001 (a stored config an older engine wrote)
        return None
    return conversations_at(team_id=run.team_id, path=path)


def conversations_at(*, team_id: int, path: str | None, valid_only: bool = False) -> Dataset | None:
    """The team's conversations dataset whose file is `path` (a config's `sft.path`), if any."""
    if not path:
        return None
    wanted = Path(path).resolve()
    datasets = Dataset.objects.filter(team_id=team_id, kind=Dataset.Kind.CHATS)
    if valid_only:
        datasets = datasets.filter(status=Dataset.Status.VALID)
    return next((d for d in datasets if d.path is not None and d.path.resolve() == wanted), None)


def startable_checkpoints(*, team: Team) -> QuerySet[Checkpoint]:
    """The checkpoints a new run may start from: those kept of the team's finished runs, newest first."""
    return Checkpoint.objects.kept().select_related("run").filter(run__team=team).exclude(
        run__status__in=Run.ACTIVE).order_by("-run_id", "-step")


def run_history_sections(*, run: Run) -> dict[str, Any]:
    """What the run page's sections below the live card show: tags, held-out results and their
    chart, evaluation jobs, artifacts, the latest checkpoint."""
    evaluations = run_lineage_evaluations(run=run)
    return {
        "tags_text": ", ".join(t.name for t in run.tags.all()),
        "held_out": held_out_of(evaluations=evaluations),
        "eval_rows": evaluations,
        "eval_chart": _eval_chart(evaluations),
        "eval_every": _eval_every(run),
        "eval_jobs": run.jobs.filter(kind=Job.Kind.EVALUATE).select_related("checkpoint")[:20],
        **run_artifacts_section(run=run),
        "latest_checkpoint": run.checkpoints.kept().newest(),
    }


def _eval_every(run: Run) -> int | None:
    """The run's `eval.every` (0: it never evaluates), None for a snapshot that no longer loads."""
    try:
        return run.to_config().eval.every
    except ValueError:
        return None


def run_lineage_evaluations(*, run: Run) -> list[Evaluation]:
    """The held-out evaluations of the run's lineage, by step and temperature: its own, and for a
    resumed run those of the runs it continues up to the step it resumed from (as its charts,
    `Run.metric_lineage`). Where two runs of the lineage evaluated the same step at the same
    temperature, the later run's row is kept."""
    rows: dict[tuple[int, float], Evaluation] = {}
    for e in Evaluation.objects.filter(run.metric_lineage()).order_by("created", "id"):
        rows[(e.step, e.temperature)] = e
    return sorted(rows.values(), key=lambda e: (e.step, e.temperature))


def _eval_chart(evaluations: list[Any]) -> dict[str, Any]:
    """Greedy held-out success per step: the team's and each agent's (for the chart)."""
    greedy = min((e.temperature for e in evaluations), default=0.0)
    rows = [e for e in evaluations if e.temperature == greedy]
    names = list(dict.fromkeys(n for e in rows for n in e.agents))
    return {
        "steps": [e.step for e in rows],
        "series": {"team": [e.team_success for e in rows],
                   **{n: [(e.agents.get(n) or {}).get("success") for e in rows] for n in names}},
    }


def run_viewable(*, user: Any, run_id: int) -> bool:
    """A logged-in member of the run's team (the same rule as the pages)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    return Run.objects.filter(pk=run_id, team__memberships__user=user).exists()


def team_run(*, team: Team, pk: int) -> Run:
    """The team's run with this id (Run.DoesNotExist for another team's), with what its answers name."""
    return Run.objects.select_related("owner", "topology", "dataset").get(pk=pk, team=team)


def run_metric_points(*, run: Run, after: int, limit: int) -> list[tuple[Any, ...]]:
    """(step, time, values, agents) of the run's metric points past step `after`, at most `limit` + 1
    (one more says there are more)."""
    return list(run.metric_points.filter(step__gt=after).order_by("step")
                .values_list("step", "time", "values", "agents")[: limit + 1])


def run_rollout_rows(*, run: Run, after: int, limit: int, step: int | None = None) -> list[tuple[Any, ...]]:
    """(id, step, episode, success, team_reward, data) of the run's episodes past id `after` in
    recording order (of one step, if given), at most `limit` + 1."""
    rows = run.rollouts.filter(id__gt=after).order_by("id")
    rows = rows.filter(step=step) if step is not None else rows
    return list(rows.values_list("id", "step", "episode", "success", "team_reward", "data")[: limit + 1])


def run_jobs(*, run: Run, kind: str) -> QuerySet[Job]:
    """The run's jobs of one kind, newest first."""
    return run.jobs.filter(kind=kind).select_related("owner").order_by("-created", "-pk")


def run_checkpoint(*, run: Run, step: int) -> Checkpoint | None:
    return run.checkpoints.filter(step=step).first()


def run_checkpoint_steps(*, run: Run) -> list[int]:
    return list(run.checkpoints.order_by("step").values_list("step", flat=True))


def run_ablation_jobs(*, run: Run) -> QuerySet[Job]:
    """The run's ablation jobs (evaluations with an `ablation`), newest first."""
    return run.jobs.filter(kind=Job.Kind.EVALUATE, params__has_key="ablation").select_related("owner").order_by("-created", "-pk")
