"""Small formatting filters for metric tables."""

from __future__ import annotations

import json
import math
from typing import Any

from django import template

register = template.Library()


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
