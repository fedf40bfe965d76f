"""Where a job stands (`webapp.jobs.selectors`), for the pages that show one job."""

from __future__ import annotations

from typing import Any

from django import template

from webapp.jobs.selectors import job_waiting_for

register = template.Library()


@register.simple_tag(takes_context=True)
def job_waiting(context: Any, job: Any) -> str:
    """The sentence that says what a queued job waits for ("" once it runs)."""
    return job_waiting_for(job=job, team=context.get("team"))
