"""A run on several hosts (`resources.hosts > 1`, `training.ray_launch`), in-process: the refusal
without a cluster (and without importing Ray), the mailbox that carries rank 0's events to the
launcher's sink and its stop request back, and the reasons a failed run is given. The real
two-node cluster is driven once, end to end, by tests/webapp/runs/test_integration_ray.py."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.training.test_distributed import Recorder
from training import ray_launch
from training.config import ConfigError, RunConfig
from training.distributed import DistributedRunError
from training.events import NullSink, StepMetrics, TrainResult
from training.ray_launch import ActorRelaySink, Outcome, RunRelay, plain_call, relay_events, result_of, scaling_kwargs
from training.runner import train

ROOT = Path(__file__).resolve().parents[2]


def _hosts_config(**overrides) -> RunConfig:
    return RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**{"resources.hosts": 2, "optim.tasks_per_step": 2, **overrides})


def test_it_refuses_a_run_on_several_hosts_without_a_cluster_and_never_imports_ray(tmp_path, monkeypatch):
    monkeypatch.delenv("TROUPE_RAY_ADDRESS", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # any `import ray` would raise ImportError
    with pytest.raises(DistributedRunError, match=r"resources.hosts: the run asks for 2 hosts.*TROUPE_RAY_ADDRESS"):
        train(_hosts_config(), out_dir=tmp_path, sink=NullSink())
    assert not list(tmp_path.iterdir()), "nothing is written for a refused run"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"resources.hosts": 0}, "resources.hosts"),
        ({"resources.hosts": 2, "optim.tasks_per_step": 1}, "optim.tasks_per_step"),
        ({"resources.hosts": 2, "resources.gpus": 2, "optim.tasks_per_step": 3}, "optim.tasks_per_step"),
        ({"resources.hosts": 2, "resources.parallel": "agents", "topology.specialization": "full"}, "resources.hosts"),
    ],
)
def test_the_hosts_setting_is_checked_by_field(overrides, field):
    with pytest.raises(ConfigError) as err:
        RunConfig.load(ROOT / "configs/tiny-lora.yaml").replace(**overrides)
    assert field in [p.field for p in err.value.problems]


def test_rank_0s_events_reach_the_launchers_sink_as_a_local_runs_do():
    relay, worker = RunRelay(), Recorder()
    rank0 = ActorRelaySink(relay, call=plain_call)
    rank0.run_started(total_steps=2, start_step=0)
    rank0.status("training", "Training step 1 of 2", progress=0.0)
    rank0.metrics(StepMetrics(step=1, total_steps=2, values={"reward/total": 0.5}))
    rank0.rollouts(1, [{"task_id": "t1", "reward": 0.5}])
    rank0.log("a line", level="warning")
    rank0.checkpoint(1, "/runs/1/checkpoints/step-000001")
    rank0.evaluation({"step": 2, "accuracy": 0.25})
    outcome = Outcome()
    relay_events(relay, worker, outcome, call=plain_call)
    assert worker.events == [
        ("run_started", 2, 0), ("status", "training", "Training step 1 of 2"), ("metrics", 1, {"reward/total": 0.5}),
        ("rollouts", 1, [{"task_id": "t1", "reward": 0.5}]), ("checkpoint", 1, "/runs/1/checkpoints/step-000001"),
        ("evaluation", 2, {"step": 2, "accuracy": 0.25}),
    ]
    assert relay.take() == [], "each event is replayed once"
    result = TrainResult(status="succeeded", step=2, start_step=0, final_metrics={"reward/total": 0.5}, checkpoint="/c")
    rank0.finish(result)
    relay_events(relay, worker, outcome, call=plain_call)
    assert result_of(outcome, None, ranks=2) == result
    assert worker.events[-1][0] == "evaluation", "the result is returned, not replayed"


def test_a_cancel_on_the_worker_reaches_rank_0():
    relay = RunRelay()
    rank0 = ActorRelaySink(relay, call=plain_call)
    relay_events(relay, Recorder(stop_after=None), Outcome(), call=plain_call)
    assert not rank0.should_stop()
    relay_events(relay, Recorder(stop_after=0), Outcome(), call=plain_call)  # the run page's cancel: the worker's sink asks to stop
    assert rank0.should_stop()  # rank 0 stops at its next step, every rank with it (`dist.any` in the trainer)


def test_rank_0s_own_error_is_the_runs_reason():
    relay = RunRelay()
    rank0 = ActorRelaySink(relay, call=plain_call)
    try:
        raise ValueError("reward plugin exploded")
    except ValueError as exc:
        rank0.fail(exc)
    outcome = Outcome()
    relay_events(relay, NullSink(), outcome, call=plain_call)
    with pytest.raises(DistributedRunError, match=r"ValueError: reward plugin exploded\n\nrank 0 traceback:"):
        result_of(outcome, RuntimeError("Training failed due to worker errors"), ranks=2)


def test_a_rank_or_host_that_died_fails_the_run_with_rays_reason():
    died = RuntimeError("Training failed due to worker errors:\n[Rank 1]\nActorDiedError: the node running this actor died")
    with pytest.raises(DistributedRunError, match=r"(?s)a rank of the 2-rank Ray run failed; resume from the last checkpoint.*node running this actor died"):
        result_of(Outcome(), died, ranks=2)
    with pytest.raises(DistributedRunError, match="ended without rank 0's result"):
        result_of(Outcome(), None, ranks=2)


RAY_MEMORY_KILL = (  # Ray 2.60's report, as a run on a busy host got it (shortened in the middle)
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
    "772dd508e448557fc5953f5209bc400ec1ab0aad1450f6741503dc8a) was 23.04GB used / 23.54GB limit (0.978685)\n"
    "OOM kill reason: Memory usage 24610586624B exceeded threshold of 24012259328B (95.0% of 25276063744B limit)\n"
    "Object store memory usage: [- objects spillable: 1\n- bytes spillable: 4377\n" + "- objects unsealed: 0\n" * 20 + "]\n"
    "Selected to kill: (Task: job ID=01000000, lease ID=18, task name=RunRelay.__init__, required resources={}, pid=20305, "
    "actual memory used=0.05GB, worker ID=32f1)\n]\n"
    "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n"
    "16145\t4.21\t.venv/bin/python bench/learning.py --arm single-async --seed 0 ...\n"
    "13063\t4.11\t.venv/bin/python bench/learning.py --arm self --seed 1 ...\n"
    "19931\t2.46\t/work/wt/x/.venv/bin/python -B -c from multiprocessing.spawn import spawn_main...\n"
    "16128\t1.24\t.venv/bin/python bench/warm_start.py --part calculator\n"
    "Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/... " + "More advice. " * 40
)


def test_a_kill_by_rays_memory_monitor_is_one_sentence_about_the_host_not_the_runs_batch():
    from webapp.runs.services import run_failure_message

    reason = ray_launch.ray_reason(RAY_MEMORY_KILL)
    assert reason == ("Ray's memory monitor killed RunRelay.__init__ on node 772dd508 (192.0.2.2): the host's memory was at "
                      "23.04GB of 23.54GB, over Ray's threshold (95.0%); its largest processes then: pid 16145 4.21 GB "
                      "(python bench/learning.py), pid 13063 4.11 GB (python bench/learning.py), pid 19931 2.46 GB (python -B). "
                      "Free memory on that host (or start Ray there with a higher RAY_memory_usage_threshold)")
    with pytest.raises(DistributedRunError) as failed:
        result_of(Outcome(), RuntimeError("Training failed due to worker errors:\n[Rank 1]\nOutOfMemoryError: " + RAY_MEMORY_KILL), ranks=2)
    message = run_failure_message(failed.value)
    assert "Ray's memory monitor killed RunRelay.__init__ on node 772dd508" in message and len(message) < 800
    assert "objects unsealed" not in message and "micro_batch_size" not in message, "a host short of memory, not a batch too large"
    assert ray_launch.ray_reason("ActorDiedError: the node died\nmore\n" * 5).count("\n") == 5, "anything else: its first lines"


WORKER_GROUP_ERROR = """Training failed due to worker errors:
[Rank 0 Error Snippet]:
A worker health check failed.
Worker info: Worker(
  actor=Actor(RayTrainWorker, 7107c25bcca10d64f1997a2801000000),
  metadata=ActorMetadata(
    hostname='vm',
    node_id='609260ec20d54d29c6feb3c35e31268d417f12288e10d4a0847aa40f',
    node_ip='192.0.2.2',
    pid=22807,
  ),
  distributed_context=DistributedContext(world_rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0),
)
The actor 7107c25bcca10d64f1997a2801000000 is unavailable: RpcError: failed to connect to all addresses
[Rank 1 Error Snippet]:
Traceback (most recent call last):
  File "/work/training/rank.py", line 29, in run_rank
    result = train(config, out_dir=out, sink=relay or NullSink(), dist=dist)
... (Output truncated. See individual worker logs for full details) ...
    work.wait()
RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9624: Connection reset by peer. This is typically caused by a remote worker hanging
"""


def test_a_host_that_died_is_named_by_its_node_in_one_line_per_failed_rank():
    """Ray Train's report of a host killed mid-run (as the run page got it from a real two-node
    cluster): the first six lines stopped inside the dead worker's repr, before its node."""
    with pytest.raises(DistributedRunError) as failed:
        result_of(Outcome(), RuntimeError(WORKER_GROUP_ERROR), ranks=2)
    assert str(failed.value) == (
        "a rank of the 2-rank Ray run failed; resume from the last checkpoint. Ray Train said: Training failed due to worker "
        "errors: rank 0 on node 609260ec (192.0.2.2): A worker health check failed; rank 1: RuntimeError: "
        "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9624: Connection reset by peer. This is typically caused by a remote worker hanging")


def test_rank_0s_broken_collective_is_a_symptom_and_the_dead_rank_is_the_reason():
    outcome = Outcome(error={"message": "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer", "traceback": "..."})
    died = RuntimeError("Training failed due to worker errors:\n[Rank 1]\nActorDiedError: the node running this actor died")
    with pytest.raises(DistributedRunError, match=r"(?s)a rank of the 2-rank Ray run failed; resume from the last checkpoint.*"
                                                  r"node running this actor died.*rank 0 saw: RuntimeError: \[gloo"):
        result_of(outcome, died, ranks=2)


def test_every_rank_gets_its_gpu_or_cpu_in_one_placement_group():
    config = _hosts_config(**{"resources.gpus": 4, "optim.tasks_per_step": 8})
    assert scaling_kwargs(config, cluster_gpus=8) == {
        "num_workers": 8, "use_gpu": True, "resources_per_worker": {"GPU": 1}, "placement_strategy": "PACK",
    }
    assert scaling_kwargs(_hosts_config(), cluster_gpus=0) == {
        "num_workers": 2, "use_gpu": False, "resources_per_worker": {"CPU": 1}, "placement_strategy": "PACK",
    }


def test_the_ranks_get_the_workers_plugin_and_cache_settings():
    env = {"TROUPE_ENVIRONMENTS": "pkg:Env", "HF_HOME": "/cache", "TROUPE_RAY_ADDRESS": "head:6379", "SECRET_KEY": "x", "PATH": "/bin"}
    assert ray_launch.forwarded_env(env) == {"TROUPE_ENVIRONMENTS": "pkg:Env", "HF_HOME": "/cache"}


def test_the_relay_carries_a_whole_result():
    result = TrainResult(status="cancelled", step=1, start_step=0, final_metrics={}, checkpoint=None)
    relay = RunRelay()
    ActorRelaySink(relay, call=plain_call).finish(result)
    assert relay.take() == [{"type": "result", **asdict(result)}]


def test_the_quiet_consoles_worker_asks_ray_for_warnings_only():
    """Ctrl-C and a run on `manage.py troupe`'s worker (TROUPE_QUIET_CONSOLE=1) print no Ray INFO
    lines; a worker started by hand keeps them. The keyword is one `ray.init` takes."""
    import inspect
    import logging

    import ray

    from training.ray_launch import ray_init_logging

    assert ray_init_logging({"TROUPE_QUIET_CONSOLE": "1"}) == {"logging_level": logging.WARNING}
    assert ray_init_logging({}) == {"logging_level": logging.INFO}
    assert set(ray_init_logging({})) <= set(inspect.signature(ray.init).parameters)
