"""How long a run will take before it starts, from the team's own recent runs: the run form's
estimate, and the experiment form's (`webapp.experiments.selectors.experiment_estimate`)."""

from __future__ import annotations

import statistics
from datetime import timedelta

from training.config import RunConfig
from webapp.models import Run, Team


def seconds_per_step(*, team: Team, environment: str) -> float | None:
    """The median wall time per step of the team's last succeeded runs (of this environment if it
    has any). None before any run finished."""
    done = Run.objects.filter(team=team, status=Run.Status.SUCCEEDED, started__isnull=False, finished__isnull=False, step__gt=0)
    same = done.filter(environment=environment)
    rows = list((same if same.exists() else done).order_by("-finished").values("started", "finished", "step", "resumed_at_step")[:20])
    rates = [(r["finished"] - r["started"]).total_seconds() / max(r["step"] - (r["resumed_at_step"] or 0), 1) for r in rows]
    return statistics.median(rates) if rates else None


def run_estimate(*, team: Team, config: RunConfig) -> timedelta | None:
    """Roughly how long a run of `config` takes: its steps at the team's recent seconds per step."""
    rate = seconds_per_step(team=team, environment=config.topology.environment)
    return None if rate is None else timedelta(seconds=round(rate * config.optim.steps))
