"""Template helpers for the live run page and the dashboard's live progress."""

from __future__ import annotations

from typing import Any

from django import template
from django.db.models import QuerySet

from training.config import ConfigError
from webapp.models import Run
from webapp.templatetags.troupe import hours_minutes_seconds

register = template.Library()


@register.simple_tag
def run_agent_names(run: Run) -> list[str]:
    """The run's agents in acting order (from its config snapshot), for the rollout filter."""
    try:
        return [a.name for a in run.to_config().topology.agents]
    except (ConfigError, ValueError, TypeError, AttributeError):
        return []


@register.filter
def newest(rows: Any, n: int) -> list[Any]:
    """The last `n` rows of an ordered queryset, still in its order (a summary table stays short
    on a 10,000-step run; its chart shows everything)."""
    if isinstance(rows, QuerySet):
        return list(rows.reverse()[:n])[::-1]
    return list(rows)[-n:]


@register.filter
def eta(run: Any) -> str:
    """"ETA 3m 20s" for a running run ("ETA 3m 20s · evaluating" outside a training step, "ETA after
    the first step" before one has been timed), else empty (static/js/run-live.js says the same)."""
    if not isinstance(run, Run) or run.status != Run.Status.RUNNING:
        return ""
    label = f" · {run.phase}" if run.phase and run.phase != "training" else ""
    seconds = run.eta_seconds()
    return f"ETA after the first step{label}" if seconds is None else f"ETA {duration(seconds)}{label}"


@register.filter
def duration(seconds: Any) -> str:
    """Seconds as the live page's script writes them ("3m 05s"): static/js/run-live.js fmtDuration."""
    try:
        h, m, sec = hours_minutes_seconds(float(seconds))
    except (TypeError, ValueError):
        return ""
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {sec:02d}s"
    return f"{sec}s"
