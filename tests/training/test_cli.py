"""`python -m training`: `run` on the tiny example config writes metrics, rollouts and checkpoints,
`eval` evaluates a checkpoint, a resumed run counts only its own steps, bad configs and reused
output folders are refused with exit code 2.

One test starts the command as a real process (the feature's end-to-end path); the others call the
same `main` in this process, which is what `python -m training` runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example configs are named relative to the repository, as in the README


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-step tiny-lora run, made once for the tests that evaluate and resume it."""
    out = tmp_path_factory.mktemp("cli") / "one-step"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ROOT)
        assert main(["run", "configs/tiny-lora.yaml", "--out", str(out), "--set", "optim.steps=1"]) == 0
    return out


@pytest.mark.slow
def test_it_runs_the_tiny_lora_example_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--out", str(out), "--set", "data.train_size=8"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "succeeded: 2 steps" in proc.stdout
    assert "held-out team success: step 0" in proc.stdout
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert {"tool", "reasoner"} <= set(metrics[0]["agents"])
    episode = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert len(episode["turns"][0]["candidates"]) == 4
    ckpt = out / "checkpoints" / "step-000002"
    assert (ckpt / "tool" / "adapter_config.json").exists() and (ckpt / "reasoner" / "adapter_config.json").exists()
    assert (ckpt / "trainer_state.pt").exists()


def test_it_reports_config_errors_by_field(tmp_path, in_repo, capsys):
    assert main(["run", "configs/tiny-lora.yaml", "--set", "grpo.k=1", "--out", str(tmp_path)]) == 2
    assert "grpo.k: must be at least 2" in capsys.readouterr().err


def test_it_evaluates_a_checkpoint(one_step_run, in_repo, capsys):
    capsys.readouterr()
    assert main(["eval", "configs/tiny-lora.yaml", "--checkpoint", str(one_step_run / "checkpoints" / "step-000001")]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["step"] == 1 and result["n"] == 8 and set(result["agents"]) == {"tool", "reasoner"}
    assert "episodes" not in result  # printed: the numbers


def test_it_refuses_to_mix_two_runs_in_one_output_folder(tmp_path, in_repo, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["run", "configs/tiny-lora.yaml", "--out", str(tmp_path)]) == 2
    assert "already holds a run's metrics" in capsys.readouterr().err
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'  # untouched


def test_a_resumed_runs_summary_counts_only_its_own_steps(one_step_run, tmp_path, in_repo, capsys):
    capsys.readouterr()
    code = main(["run", "configs/tiny-lora.yaml", "--out", str(tmp_path / "second"),
                 "--set", f"checkpoint.resume_from={one_step_run / 'checkpoints' / 'step-000001'}"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert "succeeded: 1 steps (resumed at step 1)" in out
    assert "held-out team success at step 2:" in out
