"""Template helpers of the history pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()


@register.simple_tag
def delta(value: Any, unit: str = "") -> SafeString | str:
    """A signed change, green when it went up, red when down (held-out success before -> after).
    With `unit="%"` the change of a 0-1 share in percentage points: (+12.5 pts)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    css = "up" if value > 1e-12 else "down" if value < -1e-12 else "flat"
    if unit == "%":
        text = "no change" if css == "flat" else f"{'+' if value > 0 else '−'}{_pct(abs(value))} pts"
        return format_html('<span class="delta {}">({})</span>', css, text)
    return format_html('<span class="delta {}">({}{})</span>', css, "+" if value > 0 else "", f"{value:.3g}")


@register.filter
def share(value: Any) -> str:
    """A 0-1 share as a percentage: 0.125 -> "12.5%", 0 -> "0%"; missing as a dash."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "—"
    return f"{_pct(value)}%"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}".removesuffix(".0")


@register.filter
def filesize(n: Any) -> str:
    try:
        size = float(n)
    except (TypeError, ValueError):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


@register.filter
def any_active(jobs: Any) -> bool:
    """Whether a job in the list is still queued or running (its section keeps polling)."""
    return any(getattr(job, "is_active", False) for job in jobs or [])


@register.filter
def task_summary(job: Any) -> str:
    """The first text field of a playground job's task row (its question or prompt)."""
    row = (getattr(job, "params", None) or {}).get("row") or {}
    if not isinstance(row, dict):
        return ""
    return next((str(v) for v in row.values() if isinstance(v, str) and v.strip()), "")
