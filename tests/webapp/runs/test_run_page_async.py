"""A run with `generation.async` charts, per agent, how stale its rollouts were and the
importance weight that corrected them, and run-wide how long each update waited for rollouts."""

from __future__ import annotations

from django.utils import timezone

from webapp.models import MetricPoint, Run
from webapp.runs.streaming import metrics_message


def test_it_charts_the_staleness_and_the_correction_per_agent(alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="succeeded", step=2, finished=timezone.now(), started=timezone.now())
    for step, stale, weight in ((1, 0.0, None), (2, 1.0, 0.97)):
        agent = {"loss": 0.25, "async/staleness": stale, **({"mismatch/is_weight": weight} if weight else {})}
        MetricPoint.objects.create(run=run, step=step, values={"reward/total": 0.5, "async/wait_time": 0.5 * step},
                                   agents={"tool": agent}, time=timezone.now())
    message = metrics_message(run_id=run.pk)
    tool = message["agents"]["tool"]
    assert tool["async/staleness"] == [[1, 2], [0.0, 1.0]]
    assert tool["mismatch/is_weight"][1][-1] == 0.97
    assert message["run"]["async/wait_time"][1] == [0.5, 1.0]
