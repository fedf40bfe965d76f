"""`generation.async: one_step_off`: a sampler process (a thread where a process cannot serve)
makes step t+1's rollouts during step t's update. At staleness 0 it is the synchronous run; stale
rollouts are reweighed by truncated importance sampling; resume, cancel and a failing sampler
behave as in a synchronous run."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest
import torch

from agents import plugins
from tests.training.conftest import DENSE_REWARD
from tests.training.toy_env import completion_length
from training import async_rollout, collect, watchdog
from training.config import ConfigError, RunConfig
from training.events import NullSink
from training.policies import build_policies, load_policy_weights
from training.trainer import train

LENGTH = DENSE_REWARD
BREAKS = "tests.training.test_async_rollout:breaks_in_the_sampler_process"


def breaks_in_the_sampler_process(prompts, completions, **columns):
    """`completion_length`, until the file named by TROUPE_TEST_BREAK_WHEN exists: then, in the sampler
    process only, it raises (TROUPE_TEST_BREAK_HOW=raise), ends the process (exit) or stops it
    (stop: SIGSTOP, as a hung process looks from outside)."""
    if multiprocessing.parent_process() is not None and Path(os.environ["TROUPE_TEST_BREAK_WHEN"]).exists():
        if os.environ["TROUPE_TEST_BREAK_HOW"] == "exit":
            os._exit(3)
        if os.environ["TROUPE_TEST_BREAK_HOW"] == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        raise OSError("disk full in the sampler")
    return completion_length(prompts, completions)


def sampler_processes():
    return [p for p in multiprocessing.active_children() if p.name == "troupe-sampler"]


class Recorder(NullSink):
    def __init__(self, stop_after: int | None = None):
        self.steps: list = []
        self.episodes: dict[int, list] = {}
        self.stop_after = stop_after
        self.lines: list[str] = []

    def log(self, message, *, level="info"):
        self.lines.append(message)

    def metrics(self, metrics):
        self.steps.append(metrics)

    def rollouts(self, step, episodes):
        self.episodes[step] = episodes

    def should_stop(self):
        return self.stop_after is not None and len(self.steps) >= self.stop_after


@pytest.fixture(autouse=True)
def one_thread_and_a_dense_reward():
    """Bitwise equality needs the same torch thread count on both sides (a float sum's order
    follows it); the async run splits the budget between its threads, so give each one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    plugins.register(LENGTH, kind=plugins.REWARD_FUNCTION)
    plugins.register(BREAKS, kind=plugins.REWARD_FUNCTION)
    yield
    plugins.unregister(LENGTH, kind=plugins.REWARD_FUNCTION)
    plugins.unregister(BREAKS, kind=plugins.REWARD_FUNCTION)
    torch.set_num_threads(before)


def config(make_config, specialization="lora", **overrides):
    return make_config(specialization, **{"optim.steps": 3, "data.reward_fn": LENGTH, **overrides})


def weights(config, checkpoint):
    policies = build_policies(config, device=torch.device("cpu"))
    load_policy_weights(policies, checkpoint)
    return {f"{pol.name}.{i}": p.detach().clone() for pol in policies.trainable() for i, p in enumerate(pol.params)}


def texts(sink):
    return {step: [[c["text"] for t in ep["turns"] for c in t["candidates"]] for ep in eps] for step, eps in sink.episodes.items()}


@pytest.mark.parametrize("kind", ["process", "thread"])
def test_at_staleness_0_it_makes_the_synchronous_runs_rollouts_and_weights(make_config, tmp_path, monkeypatch, kind):
    sync, sync_sink = config(make_config), Recorder()
    straight = train(sync, out_dir=tmp_path / "sync", sink=sync_sink)
    monkeypatch.setitem(async_rollout.LAGS, "one_step_off", 0)  # the sampler waits for each update
    lagged, lagged_sink = sync.replace(**{"generation.async": "one_step_off", "generation.async_sampler": kind}), Recorder()
    result = train(lagged, out_dir=tmp_path / "async", sink=lagged_sink)
    want = "async sampler: a process of its own" if kind == "process" else "async sampler: a thread (generation.async_sampler: thread)"
    (plan_line,) = [line for line in lagged_sink.lines if line.startswith("plan: ")]  # logged once
    assert want in plan_line

    assert texts(lagged_sink) == texts(sync_sink) and len(texts(sync_sink)) == 3
    assert [m.values["async/staleness"] for m in lagged_sink.steps] == [0.0, 0.0, 0.0]
    a, b = weights(sync, straight.checkpoint), weights(sync, result.checkpoint)
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), name
    moved = weights(sync, build_and_save(sync, tmp_path / "init"))
    assert any(not torch.equal(moved[n], a[n]) for n in a), "the run trained nothing"


def build_and_save(config, folder):
    from training.policies import save_policies

    save_policies(build_policies(config, device=torch.device("cpu")), folder)
    return folder


@pytest.mark.parametrize("specialization", ["single", "prompt", "lora", "full"])
def test_it_reweighs_stale_rollouts_and_records_the_staleness_per_agent(make_config, tmp_path, specialization):
    sink = Recorder()
    train(config(make_config, specialization, **{"generation.async": "one_step_off"}), out_dir=tmp_path, sink=sink)

    assert [m.values["async/staleness"] for m in sink.steps] == [0.0, 1.0, 1.0]
    first, *later = sink.steps
    for agent, values in first.agents.items():  # on-policy: the sampler's log-probs are dropped, the weight is 1
        assert values["async/staleness"] == 0.0 and "mismatch/is_weight" not in values, agent
    for m in later:
        for agent, values in m.agents.items():
            assert values["async/staleness"] == 1.0, agent
            assert values["mismatch/logp_diff"] > 1e-4 and values["mismatch/is_weight"] != pytest.approx(1.0, abs=1e-5), (m.step, agent)


def test_a_resumed_run_takes_the_rollouts_the_checkpoint_kept(make_config, tmp_path):
    run = config(make_config, **{"generation.async": "one_step_off", "optim.steps": 4})
    straight_sink = Recorder()
    straight = train(run, out_dir=tmp_path / "straight", sink=straight_sink)

    stopped = train(run, out_dir=tmp_path / "a", sink=Recorder(stop_after=2))
    assert stopped.status == "cancelled" and stopped.step == 2
    assert (tmp_path / "a" / "checkpoints" / "step-000002" / async_rollout.PENDING_FILE).is_file()
    assert not [t for t in threading.enumerate() if t.name.startswith("troupe-sampler")], "the sampler's thread outlived the run"
    assert not sampler_processes(), "the sampler process outlived the run"

    resumed_sink = Recorder()
    resumed = train(run.replace(**{"checkpoint.resume_from": stopped.checkpoint}), out_dir=tmp_path / "b", sink=resumed_sink)
    assert resumed.status == "succeeded" and resumed.step == 4
    assert texts(resumed_sink) == {s: t for s, t in texts(straight_sink).items() if s > 2}
    a, b = weights(run, straight.checkpoint), weights(run, resumed.checkpoint)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_failing_sampler_thread_fails_the_run_with_its_reason_and_the_run_resumes(make_config, tmp_path, monkeypatch):
    run = config(make_config, **{"generation.async": "one_step_off", "generation.async_sampler": "thread", "optim.steps": 4,
                                 "checkpoint.every": 1})
    real = collect._rollout

    def breaks_at_step_3(sampler, batch):
        if threading.current_thread().name.startswith("troupe-sampler") and batch[0][0].endswith("@3"):
            raise OSError("disk full in the sampler")
        return real(sampler, batch)

    monkeypatch.setattr(collect, "_rollout", breaks_at_step_3)
    with pytest.raises(RuntimeError, match=r"sampler thread failed making the rollouts of step 3: OSError: disk full in the sampler"):
        train(run, out_dir=tmp_path / "a", sink=NullSink())
    assert not [t for t in threading.enumerate() if t.name.startswith("troupe-sampler")]

    monkeypatch.setattr(collect, "_rollout", real)
    last = tmp_path / "a" / "checkpoints" / "step-000002"
    resumed = train(run.replace(**{"checkpoint.resume_from": str(last)}), out_dir=tmp_path / "b", sink=NullSink())
    assert resumed.status == "succeeded" and resumed.step == 4


@pytest.mark.parametrize("how, reason", [("raise", "OSError: disk full in the sampler"), ("exit", r"the process died \(exit code 3\)")])
def test_a_failing_or_dying_sampler_process_fails_the_run_with_its_reason_and_the_run_resumes(make_config, tmp_path, monkeypatch,
                                                                                             how, reason):
    # Step 3's rollouts start once step 2's have been taken, after checkpoint 1 is written.
    run = config(make_config, **{"generation.async": "one_step_off", "optim.steps": 4, "checkpoint.every": 1, "data.reward_fn": BREAKS})
    monkeypatch.setenv("TROUPE_TEST_BREAK_WHEN", str(tmp_path / "a" / "checkpoints" / "step-000001"))
    monkeypatch.setenv("TROUPE_TEST_BREAK_HOW", how)
    with pytest.raises(RuntimeError, match=rf"sampler process failed making the rollouts of step 3: {reason}"):
        train(run, out_dir=tmp_path / "a", sink=NullSink())
    assert not sampler_processes() and not [t for t in threading.enumerate() if t.name.startswith("troupe-sampler")]

    monkeypatch.setenv("TROUPE_TEST_BREAK_WHEN", str(tmp_path / "never"))
    last = tmp_path / "a" / "checkpoints" / "step-000002"
    resumed = train(run.replace(**{"checkpoint.resume_from": str(last)}), out_dir=tmp_path / "b", sink=NullSink())
    assert resumed.status == "succeeded" and resumed.step == 4


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0] == "T"


def test_a_stopped_sampler_process_is_killed_and_fails_the_run_naming_it(make_config, tmp_path, monkeypatch):
    # Issue 45, class 5: the trainer waited on the process's pipe with no bound while the worker's
    # heartbeat went on; a SIGSTOPped sampler kept the run "running" forever.
    run = config(make_config, **{"generation.async": "one_step_off", "optim.steps": 4, "checkpoint.every": 1, "data.reward_fn": BREAKS})
    monkeypatch.setenv("TROUPE_TEST_BREAK_WHEN", str(tmp_path / "a" / "checkpoints" / "step-000001"))
    monkeypatch.setenv("TROUPE_TEST_BREAK_HOW", "stop")
    monkeypatch.setenv(watchdog.SILENT_ENV, "5")
    with pytest.raises(RuntimeError, match=r"sampler process failed making the rollouts of step 3: the process \(pid \d+\) sent no "
                                           r"heartbeat for \d+ s \(stopped or hung; the limit is TROUPE_CHILD_SILENT_SECONDS=5\): killed"):
        train(run, out_dir=tmp_path / "a", sink=NullSink())
    assert not sampler_processes() and not [t for t in threading.enumerate() if t.name.startswith("troupe-sampler")]


class StopsWhenTheSamplerIsStopped(Recorder):
    """Asks to stop once the sampler process is SIGSTOPped (and only then)."""

    def __init__(self):
        super().__init__()
        self.stopped_sampler: list[int] = []

    def should_stop(self):
        self.stopped_sampler += [p.pid for p in sampler_processes() if stopped(p.pid)]
        return bool(self.stopped_sampler)


def test_a_stop_lands_while_the_sampler_process_is_stopped(make_config, tmp_path, monkeypatch):
    run = config(make_config, **{"generation.async": "one_step_off", "optim.steps": 4, "checkpoint.every": 1, "data.reward_fn": BREAKS})
    monkeypatch.setenv("TROUPE_TEST_BREAK_WHEN", str(tmp_path / "a" / "checkpoints" / "step-000001"))
    monkeypatch.setenv("TROUPE_TEST_BREAK_HOW", "stop")
    monkeypatch.setenv(watchdog.SILENT_ENV, "3600")  # the stop, not the silence, ends it
    sink = StopsWhenTheSamplerIsStopped()
    result = train(run, out_dir=tmp_path / "a", sink=sink)
    assert result.status == "cancelled" and sink.stopped_sampler and result.step == 2, (result, sink.lines)
    assert any("stop requested while the sampler process made the rollouts of step 3" in line for line in sink.lines), sink.lines
    assert (tmp_path / "a" / "checkpoints" / "step-000002").is_dir()
    assert not sampler_processes() and not [t for t in threading.enumerate() if t.name.startswith("troupe-sampler")]


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_silence_limit_names_the_variable(raw):
    with pytest.raises(ValueError, match="TROUPE_CHILD_SILENT_SECONDS must be a positive number of seconds"):
        watchdog.silent_limit({"TROUPE_CHILD_SILENT_SECONDS": raw})
    assert watchdog.silent_limit({}) == watchdog.DEFAULT_SILENT_S and watchdog.silent_limit({"TROUPE_CHILD_SILENT_SECONDS": "2.5"}) == 2.5


def test_the_mode_reads_from_yaml_and_a_bad_one_names_the_field(make_config):
    base = make_config("lora").to_yaml()
    assert "async: 'off'" in base or "async: off" in base
    off = RunConfig.from_yaml(base.replace("async: 'off'", "async: off"))  # YAML 1.1 reads a bare off as false
    assert off.generation.async_ == "off"
    on = RunConfig.from_yaml(base, overrides=["generation.async=one_step_off"])
    assert on.generation.async_ == "one_step_off" and RunConfig.from_yaml(on.to_yaml()) == on
    with pytest.raises(ConfigError) as err:
        RunConfig.from_yaml(base, overrides=["generation.async=two_steps_off"])
    assert err.value.field == "generation.async"
    with_vllm = RunConfig.from_yaml(base, overrides=["generation.async=one_step_off", "generation.backend=vllm"])
    assert with_vllm.generation.async_ == "one_step_off"  # its sampler is a thread driving the run's engine


def test_a_process_needs_shared_memory_and_open_files_for_its_weights_and_a_run_without_them_gets_a_thread(make_config, tmp_path,
                                                                                                           monkeypatch):
    run = config(make_config, **{"generation.async": "one_step_off", "optim.steps": 1})
    policies = build_policies(run, device=torch.device("cpu"))
    tensors = len(async_rollout._tensors(policies))
    raised = []
    monkeypatch.setattr(async_rollout.resource, "getrlimit", lambda which: (64, 1_000_000))
    monkeypatch.setattr(async_rollout.resource, "setrlimit", lambda which, limits: raised.append(limits))
    assert async_rollout._no_room_for_a_process(policies) == ""
    assert raised and raised[0][1] == 1_000_000 and raised[0][0] > tensors  # the soft limit raised, the hard one kept

    monkeypatch.setattr(async_rollout.resource, "getrlimit", lambda which: (64, 64))
    sink = Recorder()
    assert train(run, out_dir=tmp_path / "files", sink=sink).status == "succeeded"
    (plan_line,) = [line for line in sink.lines if line.startswith("plan: ")]
    assert "async sampler: a thread (the open-files limit (RLIMIT_NOFILE) is 64" in plan_line, plan_line

    monkeypatch.undo()
    real = os.statvfs
    monkeypatch.setattr(async_rollout.os, "statvfs", lambda path: real(path) if path != "/dev/shm" else os.statvfs_result((4096,) * 2 + (0,) * 8))
    why = async_rollout._no_room_for_a_process(policies)
    assert why.startswith("/dev/shm has 0 MiB free for ") and "shm_size" in why, why
