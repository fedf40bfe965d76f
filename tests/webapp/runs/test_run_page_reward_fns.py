"""A run scored by several reward functions (`reward.functions`) charts each one: the backlog
and the live deltas carry every `reward/fn/<name>` series the run logged, and nothing else that
happens to share the metrics dict."""

from __future__ import annotations

from django.utils import timezone

from webapp.models import MetricPoint
from webapp.runs.series import metrics_delta, metrics_message


def test_the_backlog_carries_each_reward_function(alice_world):
    run = alice_world.run
    for step, fmt, short in ((1, 0.25, 0.5), (2, 0.75, 0.625), (3, 1.0, 0.75)):
        MetricPoint.objects.create(
            run=run, step=step, time=timezone.now(),
            values={"reward/total": fmt + short, "reward/fn/format_ok": fmt, "reward/fn/short_answer": short, "scratch": 7.0},
            agents={"tool": {"loss": 0.1}},
        )
    series = metrics_message(run_id=run.pk)["run"]
    assert series["reward/fn/format_ok"] == [[1, 2, 3], [0.25, 0.75, 1.0]]
    assert series["reward/fn/short_answer"] == [[1, 2, 3], [0.5, 0.625, 0.75]]
    assert "scratch" not in series  # only charted series travel
    assert not [k for k in metrics_message(run_id=alice_world.run.pk, since=3)["run"] if k.startswith("reward/fn/")]


def test_a_live_step_carries_its_reward_functions_and_drops_non_numbers():
    delta = metrics_delta({"step": 4, "total_steps": 10, "time": 1.0, "values": {
        "reward/total": 1.0, "reward/fn/format_ok": 0.5, "reward/fn/broken": "n/a", "reward/fn/flag": True,
        "reward/fn/overflow": float("inf"), "scratch": 3.0}})
    assert delta["run"] == {"reward/total": [[4], [1.0]], "reward/fn/format_ok": [[4], [0.5]], "reward/fn/overflow": [[4], [None]]}
