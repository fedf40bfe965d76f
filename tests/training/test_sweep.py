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
    def train(config, *, out_dir, sink):
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
