"""A run that sampled with vLLM shows the sampler/trainer mismatch per agent: in the latest
metrics table and in the charted series the page streams."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from webapp.models import MetricPoint, Run
from webapp.runs.series import metrics_message


def test_it_shows_and_charts_the_mismatch_per_agent(alice, alice_world):
    run = alice_world.run
    Run.objects.filter(pk=run.pk).update(status="succeeded", step=2, finished=timezone.now(), started=timezone.now())
    for step, diff in ((1, 0.0123), (2, 0.0456)):
        MetricPoint.objects.create(
            run=run, step=step, values={"reward/total": 0.5},
            agents={"tool": {"loss": 0.25, "mismatch/logp_diff": diff, "mismatch/capped": 0.125}, "reasoner": {"loss": 0.5}},
            time=timezone.now(),
        )
    html = alice.client.get(reverse("run_detail", args=[run.pk])).content.decode()
    assert "mismatch/logp_diff" in html and "0.0456" in html and "mismatch/capped" in html
    series = metrics_message(run_id=run.pk)["agents"]["tool"]
    assert series["mismatch/logp_diff"] == [[1, 2], [0.0123, 0.0456]]
    assert series["mismatch/capped"][1] == [0.125, 0.125]
