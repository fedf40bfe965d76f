"""The rollout viewer's episodes: its filter (`RolloutFilter`), its pages (`rollouts_page`, the
context of `runs/_episodes.html`) and one episode as the template shows it (`episode_view`).

Episodes of any size never go through the websocket: the socket only announces the newest id, and
the page fetches what it lacks over HTTP (`runs/<id>/rollouts/?after=<id>` + its filter).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import TextField
from django.db.models.functions import Cast

from webapp.models import Rollout, Run

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
