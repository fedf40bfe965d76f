"""Small formatting filters for metric tables."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

import yaml
from django import template
from django.utils import timezone
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def username(name: str) -> str:
    """A username as shown where a look-alike could deceive (`webapp.teams.usernames.shown`)."""
    from webapp.teams.usernames import shown

    return shown(name or "")


@register.filter
def get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@register.filter
def metric(value: Any) -> str:
    """Numbers to 4 significant digits; anything else as text; missing as a dash."""
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
            return f"{int(value)}"
        return f"{value:.4g}"
    return str(value)


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


@register.filter
def codespans(text: Any) -> SafeString:
    """Help text with `backticked` names shown as <code> (the text escaped first, unless it is
    already safe HTML, as Django's password rules are)."""
    return mark_safe(_CODE_SPAN.sub(r"<code>\1</code>", str(conditional_escape(text))))  # noqa: S308 (escaped above)


@register.filter
def sorted_items(mapping: Any) -> list[tuple[str, Any]]:
    return sorted(mapping.items()) if isinstance(mapping, dict) else []


@register.filter
def agent_table(agents: Any) -> dict[str, Any]:
    """{agent: {metric: v}} -> agents as columns, metrics as rows."""
    if not isinstance(agents, dict):
        return {"agents": [], "rows": []}
    names = list(agents)
    keys = sorted({k for values in agents.values() if isinstance(values, dict) for k in values})
    return {"agents": names, "rows": [(k, [agents[n].get(k) for n in names]) for k in keys]}


@register.filter
def percent(share: Any) -> int:
    """0.374 -> 37 (a share as whole percent, for <progress max="100">)."""
    try:
        return max(0, min(100, round(100 * float(share))))
    except (TypeError, ValueError):
        return 0


@register.filter
def ago(when: Any) -> str:
    """How long ago, as a person says it: "just now", "42 s ago", "3 min ago", "2 days, 4 hours ago"."""
    if not isinstance(when, datetime):
        return ""
    seconds = (timezone.now() - when).total_seconds()
    if seconds < 5:
        return "just now"
    if seconds < 60:
        return f"{int(seconds)} s ago"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    return f"{timesince(when)} ago"


@register.filter
def took(start: Any, end: Any) -> str:
    """The time between two datetimes: "48 s", "3 min 05 s", "2 h 10 min"."""
    if not isinstance(start, datetime) or not isinstance(end, datetime):
        return ""
    h, m, sec = hours_minutes_seconds((end - start).total_seconds())
    if h:
        return f"{h} h {m:02d} min"
    if m:
        return f"{m} min {sec:02d} s"
    return f"{sec} s"


def hours_minutes_seconds(seconds: float) -> tuple[int, int, int]:
    """A non-negative duration rounded to whole seconds, split for display."""
    s = max(0, round(seconds))
    h, rem = divmod(s, 3600)
    return h, *divmod(rem, 60)


def _resources(config_yaml: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(config_yaml or "") or {}
    except yaml.YAMLError:
        return {}
    resources = data.get("resources") if isinstance(data, dict) else None
    return resources if isinstance(resources, dict) else {}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@register.filter
def resources(run: Any) -> str:
    """What a run asks of its worker, when more than one GPU: `3 GPUs on one host (fsdp)`, or for a
    run on several hosts `2 hosts x 4 GPUs: 8 ranks on the Ray cluster (data)` (CPUs where the
    cluster gave CPUs; `x 4 ranks each` before the grant, when whether they are GPUs or CPUs is the
    cluster's to say), '' for a one-GPU run. The Ray nodes it was granted: `ray_nodes`."""
    hosts, gpus = int(getattr(run, "hosts", 1) or 1), int(getattr(run, "gpus", 1) or 1)
    parallel = _resources(getattr(run, "config_yaml", "")).get("parallel", "data")
    if hosts > 1:
        resource = (getattr(run, "cluster", None) or {}).get("resource")
        each = _plural(gpus, resource) if resource in ("GPU", "CPU") else f"{_plural(gpus, 'rank')} each"
        return f"{hosts} hosts × {each}: {hosts * gpus} ranks on the Ray cluster ({parallel})"
    if gpus > 1:
        return f"{gpus} GPUs on one host ({parallel})"
    return ""


@register.filter
def ray_nodes(cluster: Any) -> str:
    """The Ray nodes a run on several hosts was granted (`Run.cluster`, from the `placed` event):
    `2 Ray nodes: 1 rank on alpha, 1 rank on bravo`, with the wait when there was one; '' before. (A
    node's name may carry its id in parentheses, "vm (96cbd277)": the rank count comes first.)"""
    nodes = cluster.get("nodes") if isinstance(cluster, dict) else None
    if not isinstance(nodes, dict) or not nodes:
        return ""
    line = f"{_plural(len(nodes), 'Ray node')}: " + ", ".join(f"{_plural(int(n), 'rank')} on {name}" for name, n in nodes.items())
    waited = cluster.get("waited_s")
    if isinstance(waited, (int, float)) and waited >= 1:
        line += f", granted after {waited:.0f} s"
    return line


@register.filter
def placement(config_yaml: str) -> str:
    """A run's `resources.placement` as one line, `coder on ranks 0-1 · reviewer on rank 2 (fsdp)`,
    or '' without one. The ranks are consecutive blocks in the acting order, as
    `training.placement.layout` assigns them."""
    try:
        data = yaml.safe_load(config_yaml or "") or {}
    except yaml.YAMLError:
        return ""
    resources = data.get("resources") or {}
    placed = resources.get("placement") or {}
    if not isinstance(placed, dict) or not placed:
        return ""
    topology = data.get("topology") or {}
    order = topology.get("turn_order") or [a.get("name") for a in topology.get("agents") or []]
    parts, start = [], 0
    for agent in dict.fromkeys(order):
        n = placed.get(agent)
        if isinstance(n, int) and n > 0:
            parts.append(f"{agent} on rank {start}" if n == 1 else f"{agent} on ranks {start}-{start + n - 1}")
            start += n
    return f"{' · '.join(parts)} ({resources.get('parallel', 'data')})"
