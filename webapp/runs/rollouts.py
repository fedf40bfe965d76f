"""The rollout viewer's episodes: its filter (`RolloutFilter`), its pages (`rollouts_page`, the
context of `runs/_episodes.html`) and one episode as the template shows it (`episode_view`).

Episodes of any size never go through the websocket: the socket only announces the newest id, and
the page fetches what it lacks over HTTP (`runs/<id>/rollouts/?after=<id>` + its filter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.db.models import TextField
from django.db.models.functions import Cast

from webapp.models import Evaluation, EvaluationEpisode, Job, JobEpisode, Rollout, Run
from webapp.models.runs import PlayedEpisode

EPISODES_PAGE = 20
"""Episodes sent on connect and per "load older" request."""

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


EVALUATION_PAGE = 32
"""Held-out episodes per page of an evaluation."""


def evaluation_page(*, evaluation: Evaluation, filters: RolloutFilter | None = None, page: int = 1) -> dict[str, Any]:
    """One held-out evaluation's episodes as the rollout viewer shows them, `EVALUATION_PAGE` a page
    in task order, filtered by agent and success (its step is the evaluation's). An evaluation
    recorded before its episodes were kept shows the 3 it kept (`examples`); `kept` counts them."""
    numbers = {"temperature": evaluation.temperature, "team_success": evaluation.team_success,
               "agents": evaluation.agents or {}, "n": (evaluation.data or {}).get("n")}
    examples = (evaluation.data or {}).get("examples") or []
    return _evaluation_page(evaluation.episodes.select_related("evaluation"), numbers, filters, page,
                            older=lambda i, ep: EvaluationEpisode.played(ep, id=i + 1, evaluation=evaluation, episode=i),
                            examples=examples)


def job_evaluation_page(*, job: Job, filters: RolloutFilter | None = None, page: int = 1) -> dict[str, Any]:
    """An evaluation job's (a checkpoint on a dataset, an ablation) first evaluation, as
    `evaluation_page` shows a run's own: every episode, or the 3 a job finished before they were
    kept stored in its result (`examples`)."""
    results = (job.result or {}).get("evaluations") or []
    first = results[0] if results and isinstance(results[0], dict) else {}
    numbers = {"temperature": first.get("temperature", 0.0), "team_success": (first.get("team") or {}).get("success"),
               "agents": first.get("agents") or {}, "n": first.get("n")}
    return _evaluation_page(job.episodes.filter(evaluation=0).select_related("job"), numbers, filters, page,
                            older=lambda i, ep: JobEpisode.played(ep, id=i + 1, job=job, episode=i),
                            examples=first.get("examples") or [])


def _evaluation_page(rows: Any, numbers: dict[str, Any], filters: RolloutFilter | None, page: int, *,
                     older: Callable[[int, dict[str, Any]], PlayedEpisode], examples: list[Any]) -> dict[str, Any]:
    """A page of held-out episodes (`rows`) with the evaluation's `numbers`; where none were kept,
    the few `examples` stored with the numbers, made rows by `older`, filtered here."""
    filters = replace(filters or RolloutFilter(), step=None)
    kept = rows.count()
    if kept:
        agents = list(dict.fromkeys(a for names in rows.values_list("agent_names", flat=True) for a in names or []))
        rows = filters.apply(rows).order_by("episode")
        matched = rows.count()
    else:  # recorded before every episode was kept
        rows = [older(i, ep) for i, ep in enumerate(e for e in examples if isinstance(e, dict))]
        kept = len(rows)
        agents = list(dict.fromkeys(a for r in rows for a in r.agent_names))
        rows = [r for r in rows if (not filters.agent or filters.agent in r.agent_names) and filters.success in (None, r.success)]
        matched = len(rows)
    pages = max(1, -(-matched // EVALUATION_PAGE))
    page = min(max(1, page), pages)
    shown = list(rows[(page - 1) * EVALUATION_PAGE : page * EVALUATION_PAGE])
    first = (page - 1) * EVALUATION_PAGE
    return {"numbers": numbers, "episodes": [episode_view(r) for r in shown], "more": False, "agents": agents, "held_out": True,
            "filtered": filters != RolloutFilter(), "filters": filters, "matched": matched, "kept": kept,
            "tasks": numbers.get("n") or kept, "page": page, "pages": pages,
            "first": first + 1 if shown else 0, "last": first + len(shown)}


@dataclass
class EpisodeView:
    """One Rollout row (or a held-out episode's) as the template shows it: turns with each
    candidate's index and `chosen`."""

    row: PlayedEpisode
    question: str
    task_id: str
    turns: list[dict[str, Any]]
    agents: str


def episode_view(r: PlayedEpisode) -> EpisodeView:
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
