"""`python -m training sweep`: the trials run in turn, a failed one is recorded, a second run keeps
the finished ones, and the table shows each arm's mean ± interval and its per-seed values."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from training.__main__ import main
from training.events import TrainResult
from training.experiment import ExperimentSpec
from training.sweep import format_table, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def fake_train(calls):
    def train(config, *, out_dir, sink, hooks=None):
        calls.append((config.optim.lr, config.seed))
        if config.optim.lr == 3e-3 and config.seed == 1:
            raise RuntimeError("boom")
        success = config.optim.lr * 100 + config.seed / 10  # lr 1e-3 -> 0.1 + seed/10
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return TrainResult(status="succeeded", step=config.optim.steps, evaluations=[
            {"step": config.optim.steps, "temperature": 0.0, "team": {"success": success}, "agents": {"writer": {"success": success, "reward": 0.0}}},
        ])
    return train


def test_it_runs_every_trial_then_keeps_finished_ones_on_a_second_run(make_config, tmp_path):
    spec = ExperimentSpec.from_dict({"name": "lr", "axes": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1, 2]},
                                    base=make_config(**{"eval.every": 1}))
    calls: list = []
    summaries = run_sweep(spec, tmp_path, train=fake_train(calls), stream=io.StringIO())
    assert len(calls) == 6
    first, second = summaries
    assert abs(first.metrics["team.success"].mean - 0.2) < 1e-9 and first.metrics["team.success"].n == 3
    assert second.metrics["team.success"].n == 2  # the failed trial is left out
    failed = json.loads((tmp_path / "trial-004" / "trial.json").read_text())
    assert failed["status"] == "failed" and "boom" in failed["error"]
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert [r["status"] for r in rows].count("failed") == 1 and rows[0]["optim.lr"] == "0.001"

    table = format_table(spec, summaries)
    assert "optim.lr=0.003" in table and "0.200 ± 0.248" in table and "0:0.100 1:0.200 2:0.300" in table
    assert "best arm: optim.lr=0.003" in table

    calls.clear()
    run_sweep(spec, tmp_path, train=fake_train(calls), stream=io.StringIO())
    assert calls == []  # every trial left a trial.json, the failed one included


def test_two_sweeps_of_one_folder_share_its_trials(make_config, tmp_path):
    """The same sweep started twice at once: every trial is trained exactly once, by one of them,
    whichever takes it first (the order the two take them in is not assumed)."""
    import threading

    spec = ExperimentSpec.from_dict({"name": "lr", "axes": {"optim.lr": [1e-3, 2e-3]}, "seeds": [0, 1, 2]},
                                    base=make_config(**{"eval.every": 1}))
    calls: list = []
    started: list = []
    both_in = threading.Barrier(2)

    def train(config, *, out_dir, sink, hooks=None):
        started.append(config.seed)
        if len(started) <= 2:
            both_in.wait(timeout=60)  # the first two trials are trained at the same time, one by each sweep
        return fake_train(calls)(config, out_dir=out_dir, sink=sink)

    sweeps = [threading.Thread(target=run_sweep, args=(spec, tmp_path), kwargs={"train": train, "stream": io.StringIO()})
              for _ in range(2)]
    for t in sweeps:
        t.start()
    for t in sweeps:
        t.join()
    assert sorted(calls) == sorted((lr, seed) for lr in (1e-3, 2e-3) for seed in (0, 1, 2))
    assert not list(tmp_path.glob("*.claim"))  # each claim went with its trial
    out = io.StringIO()
    summaries = run_sweep(spec, tmp_path, train=fake_train(calls), stream=out)  # a third run finds them all done
    assert len(calls) == 6 and [s.metrics["team.success"].n for s in summaries] == [3, 3]


def hold_claim(path: Path) -> subprocess.Popen:
    """A process that holds the claim `path` as a sweep does (an exclusive flock, its pid inside)
    until killed; returned once it holds it (it says so on its stdout)."""
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "os.write(fd, str(os.getpid()).encode()); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_live_claim_is_left_alone_and_a_dead_ones_trial_is_taken_over(make_config, tmp_path):
    spec = ExperimentSpec.from_dict({"name": "lr", "axes": {"optim.lr": [1e-3]}, "seeds": [0, 1]}, base=make_config(**{"eval.every": 1}))
    tmp_path.mkdir(exist_ok=True)
    holder = hold_claim(tmp_path / "trial-000.claim")
    try:
        calls: list = []
        out = io.StringIO()
        summaries = run_sweep(spec, tmp_path, train=fake_train(calls), stream=out)
        assert calls == [(1e-3, 1)] and f"running in another sweep (pid {holder.pid}), left to it" in out.getvalue()
        assert summaries[0].metrics["team.success"].n == 1 and "left out of the table: trial-000" in out.getvalue()
    finally:
        holder.kill()
        holder.wait()
    calls.clear()
    run_sweep(spec, tmp_path, train=fake_train(calls), stream=io.StringIO())  # its holder died: taken over
    assert calls == [(1e-3, 0)] and not (tmp_path / "trial-000.claim").exists()


def test_the_table_holds_a_trial_another_sweep_finished_after_this_one_passed_it(make_config, tmp_path):
    """The last sweep of a shared folder to end reports every trial there, not only its own: here
    trial-000 is held by another sweep when this one reaches it, and that sweep finishes it (its
    record appears) while this one trains trial-001."""
    spec = ExperimentSpec.from_dict({"name": "lr", "axes": {"optim.lr": [1e-3]}, "seeds": [0, 1]}, base=make_config(**{"eval.every": 1}))
    tmp_path.mkdir(exist_ok=True)
    holder = hold_claim(tmp_path / "trial-000.claim")
    calls: list = []

    def train(config, *, out_dir, sink, hooks=None):
        other = tmp_path / "trial-000"
        other.mkdir()
        (other / "trial.json").write_text(json.dumps({"index": 0, "arm": [["optim.lr", 1e-3]], "seed": 0, "status": "succeeded",
                                                       "error": "", "metrics": {"team.success": 0.75}, "seconds": 1.0}))
        return fake_train(calls)(config, out_dir=out_dir, sink=sink)

    try:
        out = io.StringIO()
        summaries = run_sweep(spec, tmp_path, train=train, stream=out)
    finally:
        holder.kill()
        holder.wait()
    assert calls == [(1e-3, 1)] and "left out of the table" not in out.getvalue()
    assert summaries[0].metrics["team.success"].n == 2 and summaries[0].trials[0] == (0, {"team.success": 0.75})
    assert [r["trial"] for r in csv.DictReader(open(tmp_path / "results.csv"))] == ["0", "1"]


@pytest.mark.slow  # the feature's end-to-end path: `python -m training sweep` as a real process
def test_the_cli_sweeps_a_tiny_experiment(tmp_path):
    spec = {"name": "tiny", "base": str(ROOT / "configs" / "tiny-lora.yaml"), "axes": {"optim.lr": [1.0e-3]}, "seeds": [0, 1]}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, "-m", "training", "sweep", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[2/2] tiny [optim.lr=0.001] seed 1" in proc.stdout
    assert "best arm: optim.lr=0.001 (team.success" in proc.stdout
    assert (tmp_path / "out" / "trial-001" / "checkpoints").is_dir()


def test_the_cli_refuses_a_bad_experiment_with_every_problem(tmp_path, capsys):
    spec = {"name": "tiny", "base": str(ROOT / "configs" / "tiny-lora.yaml"), "axes": {"optim.lr": [2.0], "optim.speed": [1]},
            "seeds": [0, 1]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "bad.yaml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "axes.optim.lr: value 2 (item 1) is refused" in err and "axes.optim.speed: unknown field" in err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_the_cli_refuses_seeds_the_experiment_does_not_have(tmp_path, capsys):
    spec = {"name": "tiny", "base": str(ROOT / "configs" / "tiny-lora.yaml"), "axes": {"optim.lr": [1.0e-3]}, "seeds": [0, 1]}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out"), "--seeds", "1,5"]) == 2
    assert "--seeds 1,5: the experiment's seeds are 0, 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", str(tmp_path / "exp.yaml"), "--seeds", "one"])
    assert "seeds are integers separated by commas, like 0,2, not 'one'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_second_search_of_one_folder_is_refused(tmp_path, capsys):
    """A search asks each point from the finished ones: a second process on its folder is refused
    with the pid of the one that runs, and trains nothing."""
    out = tmp_path / "out"
    out.mkdir()
    holder = hold_claim(out / "search.claim")
    try:
        rc = main(["sweep", str(ROOT / "configs" / "experiments" / "tiny-search.yaml"), "--out", str(out)])
    finally:
        holder.kill()
        holder.wait()
    assert rc == 2 and f"a search of {out} already runs (pid {holder.pid})" in capsys.readouterr().err
    assert not list(out.glob("trial-*"))
