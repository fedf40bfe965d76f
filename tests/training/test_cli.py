"""`python -m training run` on the tiny example config writes metrics, rollouts and checkpoints."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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


def test_it_reports_config_errors_by_field(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--set", "grpo.k=1", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "grpo.k: must be at least 2" in proc.stderr


def test_it_evaluates_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--out", str(out), "--set", "optim.steps=1"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "training", "eval", "configs/tiny-lora.yaml", "--checkpoint", str(out / "checkpoints" / "step-000001")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 1 and result["n"] == 8 and set(result["agents"]) == {"tool", "reasoner"}


def test_it_refuses_to_mix_two_runs_in_one_output_folder(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "already holds a run's metrics" in proc.stderr


def test_a_resumed_runs_summary_counts_only_its_own_steps(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--out", str(first), "--set", "optim.steps=1"],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )
    proc = subprocess.run(
        [sys.executable, "-m", "training", "run", "configs/tiny-lora.yaml", "--out", str(second),
         "--set", f"checkpoint.resume_from={first / 'checkpoints' / 'step-000001'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "succeeded: 1 steps (resumed at step 1)" in proc.stdout
    assert "held-out team success at step 2:" in proc.stdout
