"""Long histories load fast: each series is downsampled on the server to at most MAX_POINTS
points, keeping the first and last point and every bucket's extremes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np

from tests.webapp.streams import TRANSACTIONAL, metric_steps, receive_backlog, run, socket
from webapp.core.series import downsample_minmax
from webapp.models import MetricPoint, Run
from webapp.runs import series as run_series

pytestmark = TRANSACTIONAL


def test_it_keeps_short_series_whole():
    assert downsample_minmax(np.arange(10.0), 2000) == list(range(10))


def test_it_caps_points_and_keeps_ends_and_spikes():
    values = np.sin(np.linspace(0, 20, 50_000))
    values[31_337] = 25.0  # one spike
    values[7_000] = -30.0
    keep = downsample_minmax(values, 2000)
    assert len(keep) <= 2000 and keep == sorted(set(keep))
    assert keep[0] == 0 and keep[-1] == 49_999
    assert 31_337 in keep and 7_000 in keep


def test_it_never_picks_a_missing_value():
    values = np.full(10_000, np.nan)
    values[::7] = 1.0
    keep = downsample_minmax(values, 500)
    assert len(keep) <= 500 and all(np.isfinite(values[i]) for i in keep[1:-1])


def test_it_downsamples_a_long_run_in_the_backlog(alice, alice_world):
    run_ = alice_world.run
    Run.objects.filter(pk=run_.pk).update(status="succeeded", step=5000, total_steps=5000)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run_, step=s, time=when, values={"reward/total": s % 97 / 97, "success": None if s == 10 else 1.0},
                    agents={"tool": {"loss": 1 / s}})
        for s in range(1, 5001)
    ])

    async def scenario():
        ws = socket(run_.pk, alice.client)
        assert (await ws.connect())[0]
        run_wide, per_agent = [m for m in await receive_backlog(ws) if m["t"] == "metrics"]
        assert run_wide["downsampled"] and run_wide["last"] == 5000 and per_agent["last"] == 5000
        steps = metric_steps([run_wide])
        assert len(steps) <= run_series.MAX_POINTS and steps[0] == 1 and steps[-1] == 5000
        assert len(per_agent["agents"]["tool"]["loss"][0]) <= run_series.MAX_POINTS
        assert len(run_wide["times"][0]) == run_series.TIMES_TAIL
        metrics = run_wide
        assert 10 not in metrics["run"]["success"][0]  # a value the sink stored as null (NaN) is no point
        await ws.disconnect()

    run(scenario)


def test_it_sends_nan_as_null_and_only_the_charted_series():
    message = run_series.metrics_delta({"step": 3, "total_steps": 4, "time": 1.0,
                                        "values": {"success": float("nan"), "reward/total": 1, "lr_unused": 2.0},
                                        "agents": {"tool": {"kl": float("inf"), "lr": 1e-4}}})
    assert message["run"] == {"success": [[3], [None]], "reward/total": [[3], [1.0]]}
    assert message["agents"]["tool"] == {"kl": [[3], [None]]}


def test_it_splits_a_long_backlog_into_messages_under_the_frame_limit():
    series = {f"k{i}": [list(range(2000)), [0.5] * 2000] for i in range(9)}
    message = {"t": "metrics", "last": 1999, "total": 2000, "downsampled": True, "run": series,
               "agents": {"tool": dict(series), "reasoner": dict(series)}, "times": [[1999], [1.0]]}
    parts = run_series.split_metrics(message)
    assert len(parts) > 1 and all(m["last"] == 1999 and m["downsampled"] for m in parts)
    assert all(sum(len(s[0]) for s in [*m["run"].values(), *(v for a in m["agents"].values() for v in a.values())])
               <= run_series.CHUNK_POINTS for m in parts)
    assert parts[0]["times"] == [[1999], [1.0]] and all(m["times"] == [[], []] for m in parts[1:])
    merged_run = {k: v for m in parts for k, v in m["run"].items()}
    merged_tool = {k: v for m in parts for k, v in m["agents"].get("tool", {}).items()}
    assert merged_run == series and merged_tool == series
    assert all(len(json.dumps(m)) < 1_000_000 for m in parts)


def test_it_skips_values_that_are_not_numbers(alice, alice_world):
    when = datetime(2026, 1, 1, tzinfo=UTC)
    MetricPoint.objects.bulk_create([
        MetricPoint(run=alice_world.run, step=1, time=when, values={"reward/total": 0.5, "success": "n/a"}, agents={"tool": {"loss": True}}),
        MetricPoint(run=alice_world.run, step=2, time=when, values={"reward/total": 0.25, "success": 1}, agents={"tool": {"loss": 0.125}}),
    ])
    message = run_series.metrics_message(run_id=alice_world.run.pk)
    assert message["run"]["reward/total"] == [[1, 2], [0.5, 0.25]]
    assert message["run"]["success"] == [[2], [1.0]] and message["agents"]["tool"]["loss"] == [[2], [0.125]]
