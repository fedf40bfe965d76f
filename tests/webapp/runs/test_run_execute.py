"""run_execute runs the engine with the DatabaseSink and records the outcome on the run."""

from __future__ import annotations

import time

from tests.webapp.conftest import FakeResult
from training.events import StepMetrics
from webapp.models import Run
from webapp.runs import services as run_services

EPISODE = {
    "task_id": "train-0@1", "step": 1, "success": True, "team_reward": 1.0,
    "turns": [
        {"index": 0, "agent": "tool", "role": "tool", "prompt": "p", "chosen": 0,
         "candidates": [{"text": "print(2)", "reward": 1.0, "team": 1.0, "local": 0.0, "advantage": 0.5,
                         "tool_output": "2", "tokens": 4, "truncated": False}]},
        {"index": 1, "agent": "reasoner", "role": "reasoner", "prompt": "p2", "chosen": 0, "candidates": []},
    ],
}


def fake_train(config, *, out_dir, sink):
    """Reports like the engine does for a 2-step run, then succeeds."""
    sink.log("2 training tasks")
    sink.run_started(total_steps=config.optim.steps, start_step=0)
    for step in (1, 2):
        assert not sink.should_stop()
        sink.metrics(StepMetrics(step=step, total_steps=config.optim.steps, values={"reward/total": 0.25 * step, "success": 0.5},
                                 agents={"tool": {"loss": 0.1}, "reasoner": {"loss": 0.2}}, time=time.time()))
        sink.rollouts(step, [EPISODE, {**EPISODE, "success": False, "team_reward": 0.0}])
    sink.evaluation({"step": 2, "split": "eval", "temperature": 0.0, "n": 8, "team": {"success": 0.375},
                     "agents": {"tool": {"success": 0.5, "reward": 0.4}}, "episodes": [EPISODE, {**EPISODE, "success": False}]})
    sink.checkpoint(2, str(out_dir / "checkpoints" / "step-000002"))
    return FakeResult(status="succeeded", step=2, final_metrics={"reward/total": 0.5},
                      checkpoint=str(out_dir / "checkpoints" / "step-000002"))


def test_it_records_a_successful_run(alice_world, data_dir):
    run = run_services.run_execute(run_id=alice_world.run.pk, worker="gpu@box", train=fake_train)
    assert run.status == Run.Status.SUCCEEDED
    assert (run.step, run.total_steps, run.final_metrics) == (2, 3, {"reward/total": 0.5})
    assert run.started and run.finished and run.heartbeat and run.worker == "gpu@box"
    assert run.out_dir == str(data_dir / "runs" / str(run.pk))
    assert list(run.metric_points.values_list("step", flat=True)) == [1, 2]
    assert run.metric_points.get(step=2).agents["reasoner"]["loss"] == 0.2
    assert run.rollouts.count() == 4
    first = run.rollouts.get(step=1, episode=0)
    assert first.success and first.team_reward == 1.0 and first.agent_names == ["tool", "reasoner"]
    assert run.evaluations.get().team_success == 0.375 and [e.success for e in run.evaluations.get().episodes.all()] == [True, False]
    assert run.checkpoints.get().step == 2
    assert run.log_lines.first().message == "2 training tasks"


def test_it_passes_the_snapshot_config(alice_world):
    seen = {}

    def train(config, *, out_dir, sink):
        seen["config"] = config
        return FakeResult(status="succeeded", step=3)

    run_services.run_execute(run_id=alice_world.run.pk, train=train)
    assert seen["config"] == alice_world.run.to_config()


def test_it_records_a_failure_with_the_traceback(alice_world):
    def train(config, *, out_dir, sink):
        sink.run_started(total_steps=3, start_step=0)
        raise RuntimeError("CUDA out of memory")

    run = run_services.run_execute(run_id=alice_world.run.pk, train=train)
    assert run.status == Run.Status.FAILED
    assert run.error_message.startswith("Out of memory (RuntimeError: CUDA out of memory).")
    assert run.error_message.endswith("[raised in tests/webapp/runs/test_run_execute.py:69 in train]")
    assert "Traceback" in run.traceback and "CUDA out of memory" in run.traceback
    assert run.finished is not None


def test_it_records_a_bad_snapshot_as_a_failure(alice_world):
    bad = alice_world.run.config_yaml.replace("  k: 4\n", "  k: 1\n")
    assert bad != alice_world.run.config_yaml
    Run.objects.filter(pk=alice_world.run.pk).update(config_yaml=bad)
    run = run_services.run_execute(run_id=alice_world.run.pk, train=fake_train)
    assert run.status == Run.Status.FAILED and "grpo.k" in run.error_message


def test_it_stops_when_cancel_is_requested(alice_world):
    def train(config, *, out_dir, sink):
        steps = 0
        while not sink.should_stop():
            steps += 1
            if steps == 2:
                run_services.run_cancel(run=Run.objects.get(pk=alice_world.run.pk))
        return FakeResult(status="cancelled", step=steps)

    run = run_services.run_execute(run_id=alice_world.run.pk, train=train)
    assert run.status == Run.Status.CANCELLED and run.step == 2 and run.cancel_requested
    assert run.error_message == ""


def test_it_stops_when_the_worker_shuts_down(alice_world):
    from webapp.runs.sink import WORKER_SHUTTING_DOWN

    def train(config, *, out_dir, sink):
        WORKER_SHUTTING_DOWN.set()
        assert sink.should_stop()
        return FakeResult(status="cancelled", step=1)

    try:
        run = run_services.run_execute(run_id=alice_world.run.pk, train=train)
    finally:
        WORKER_SHUTTING_DOWN.clear()
    assert run.status == Run.Status.CANCELLED and "worker shut down" in run.error_message


def test_it_marks_runs_of_a_lost_worker_failed(alice_world):
    Run.objects.filter(pk=alice_world.run.pk).update(status=Run.Status.RUNNING, worker="troupe-local@box")
    assert run_services.run_fail_lost(worker="troupe-local@box") == 1
    alice_world.run.refresh_from_db()
    assert alice_world.run.status == "failed" and "stopped" in alice_world.run.error_message


def test_it_calls_the_service_from_the_celery_task(alice_world, monkeypatch):
    from webapp.runs import tasks

    seen = {}
    monkeypatch.setattr(run_services, "run_execute", lambda **kw: seen.update(kw))
    tasks.run_execute.apply(args=[alice_world.run.pk])
    assert "run_id" not in seen  # the message claims the first queued run in queue order (webapp.runs.queue)
    assert "worker" in seen


def test_it_stores_model_output_any_database_accepts(alice_world):
    def train(config, *, out_dir, sink):
        sink.metrics(StepMetrics(step=1, total_steps=3, values={"loss": float("nan"), "kl": float("inf")}, agents={}))
        sink.rollouts(1, [{**EPISODE, "turns": [{"agent": "tool", "candidates": [{"text": "a\x00b"}]}]}])
        sink.log("saw \x00")
        return FakeResult(status="succeeded", step=1, final_metrics={"loss": float("nan")})

    run = run_services.run_execute(run_id=alice_world.run.pk, train=train)
    assert run.status == Run.Status.SUCCEEDED, run.error_message
    assert run.metric_points.get().values == {"loss": None, "kl": None}
    assert run.rollouts.get().data["turns"][0]["candidates"][0]["text"] == "a\ufffdb"
    assert run.final_metrics == {"loss": None}
