"""The run form says roughly how long the run will take, as the experiment form does (issue 46, class
3): its steps at the team's recent seconds per step; without a finished run to time, it says so."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from tests.webapp.runs.test_run_form import _data
from webapp.models import Run


def test_the_preview_estimates_the_duration(alice, alice_world):
    preview = lambda **kw: alice.client.post(reverse("run_preview"), _data(alice_world, **kw),  # noqa: E731
                                             headers={"HX-Request": "true"}).content.decode()
    assert "No finished run of your team to time yet" in preview(steps="30")
    now = timezone.now()
    Run.objects.filter(pk=alice_world.run.pk).update(status="succeeded", step=10, environment="math_tool",
                                                     started=now - timedelta(seconds=120), finished=now)  # 12 s per step
    page = preview(steps="30")
    assert "<strong>Roughly 0:06:00</strong> (h:mm:ss) for its 30 steps" in page, page
