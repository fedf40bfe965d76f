"""An SFT run's page charts its loss and token accuracy, run-wide and per agent."""

from __future__ import annotations

from django.utils import timezone

from webapp.models import MetricPoint
from webapp.runs.streaming import metrics_message


def test_it_streams_an_sft_run_s_loss_and_token_accuracy(alice_world):
    run = alice_world.run
    for step, (loss, acc) in enumerate([(2.0, 0.25), (1.5, 0.5)], start=1):
        MetricPoint.objects.create(run=run, step=step, time=timezone.now(),
                                   values={"loss": loss, "token_accuracy": acc, "tokens": 40.0},
                                   agents={"tool": {"loss": loss, "token_accuracy": acc}, "reasoner": {"loss": loss + 1, "token_accuracy": acc / 2}})
    message = metrics_message(run_id=run.pk)
    assert message["run"]["loss"][1] == [2.0, 1.5] and message["run"]["token_accuracy"][1] == [0.25, 0.5]
    assert message["agents"]["reasoner"]["token_accuracy"][1] == [0.125, 0.25]
