"""Each training benchmark runs end to end with tiny settings on the tiny-random model and writes its JSON.

These check the scripts work, never how fast anything is (timings are never asserted)."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = ["--model", "tiny-random:llama", "--threads", "1"]


def run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.slow
def test_it_compares_troupe_with_trl_and_the_specializations(tmp_path):
    out = tmp_path / "speed.json"
    # a few arms of each kind (--arms): the others are the same loop with other config values, tested on their own
    run("engine_vs_trl.py", *TINY, "--steps", "1", "--warmup", "0", "--max-new-tokens", "6", "--work-dir", str(tmp_path), "--out", str(out),
        "--arms", r"^troupe async \(|bf16 copy \(|llama\.cpp bf16 base|async llama\.cpp bf16 \(|^(prompt|lora|full)$|^lora llama\.cpp f32$")
    data = json.loads(out.read_text())
    assert set(data["single"]["arms"]) == {"trl", "troupe (stop patterns)", "troupe async (stop patterns)", "troupe bf16 copy (stop patterns)",
                                           "troupe async bf16 copy (stop patterns)", "troupe llama.cpp bf16 base (stop patterns)",
                                           "troupe async llama.cpp bf16 base (stop patterns)", "troupe async llama.cpp bf16 (stop patterns)"}
    assert data["single"]["arms"]["trl"]["ratio_to_trl"] == 1.0
    assert all(len(arm["load_1min"]) == 3 and arm["ratio_min"] <= arm["ratio_max"] for arm in data["single"]["arms"].values())
    assert data["single"]["machine_start"]["libraries"]["trl"]
    assert set(data["multi"]["arms"]) == {"prompt", "lora", "full", "lora llama.cpp f32"}


@pytest.mark.slow
def test_it_measures_peak_memory_per_specialization(tmp_path):
    out = tmp_path / "memory.json"
    run("memory.py", *TINY, "--steps", "1", "--tasks", "2", "--max-new-tokens", "6", "--out", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"prompt", "lora", "full"}
    assert all(r["peak_rss_mib"] > 0 for r in runs.values())


@pytest.mark.slow
def test_it_measures_one_updates_memory_with_and_without_checkpointing(tmp_path):
    out = tmp_path / "checkpointing.json"
    run("checkpointing.py", *TINY, "--groups", "1", "--k", "2", "--prompt", "8", "--completion", "8", "--out", str(out))
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"plain", "checkpointing"}
    assert runs["plain"]["ratio_to_plain"] == 1.0
    assert runs["checkpointing"]["grad_norm"] == pytest.approx(runs["plain"]["grad_norm"], rel=1e-5)


@pytest.mark.slow
def test_it_writes_one_json_per_arm_and_a_report(tmp_path):
    common = [*TINY, "--steps", "2", "--eval-every", "1", "--eval-size", "3", "--max-new-tokens", "6", "--work-dir", str(tmp_path), "--out-dir", str(tmp_path)]
    for arm in ("untrained-single", "single", "trl"):
        run("learning.py", "--arm", arm, *common)
    trained = json.loads((tmp_path / "single.json").read_text())
    assert trained["steps"] == 2 and [e["step"] for e in trained["evals"]] == [1, 2, 2]  # greedy each step, sampled at the end
    assert "| trl |" in run("learning.py", "--report", "--out-dir", str(tmp_path))
    assert (tmp_path / "learning.png").stat().st_size > 0


def test_the_gpu_benchmark_says_what_it_needs_without_cuda_and_vllm(tmp_path, capsys):
    import torch

    from training.plan import vllm_installed

    if torch.cuda.is_available() and vllm_installed():
        pytest.skip("this machine has CUDA and vLLM: see test_it_compares_hf_vllm_and_trl_on_the_gpu")
    gpu = runpy.run_path(str(REPO / "bench" / "gpu.py"))  # its `main`, in this process (run_name is not __main__)
    assert gpu["main"](["--out", str(tmp_path / "gpu.json")]) == 2
    assert "needs CUDA and vLLM" in capsys.readouterr().err
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.gpu
@pytest.mark.slow
def test_it_compares_hf_vllm_and_trl_on_the_gpu(tmp_path):
    pytest.importorskip("vllm")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    out = tmp_path / "gpu.json"
    run("gpu.py", "--steps", "1", "--warmup", "0", "--tasks", "2", "--k", "2", "--max-new-tokens", "16",
        "--work-dir", str(tmp_path), "--out", str(out))
    data = json.loads(out.read_text())
    assert data["generation"]["tokens_per_s"]["vllm"] > 0 and data["step"]["ratio"] > 0 and data["step"]["async_ratio"] > 0


@pytest.mark.slow
def test_the_warm_start_benchmark_learns_worked_calls_and_compares_grpo_warm_with_cold(tmp_path):
    common = ["--model", "tiny-random:llama", "--eval-size", "2", "--sft-steps", "1", "--sft-batch", "2", "--out-dir", str(tmp_path),
              "--work-dir", str(tmp_path / "work")]
    out = run("warm_start.py", "--part", "calculator", *common, "--worked", "2", "--samples", "1", "--seeds", "0", "--grpo-steps", "1",
              "--tasks", "1", "--k", "2")
    result = json.loads((tmp_path / "calculator.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "work" / "calculator" / "worked-calls.jsonl").read_text().splitlines()]
    assert result["worked_examples"] == len(rows) == 2
    assert [m["role"] for m in rows[0]["completion"]] == ["assistant", "tool", "assistant"] and "<tool_call>" in rows[0]["completion"][0]["content"]
    assert rows[0]["completion"][1]["content"] == rows[0]["completion"][2]["content"].removeprefix("Answer: "), "the calculator's real result"
    assert [(g["start"], g["seed"], g["steps"]) for g in result["grpo"]] == [("cold", 0, 1), ("warm", 0, 1)]
    assert {"greedy_success", "sampled"} <= set(result["warm"]) and "GRPO from the SFT model" in out

    # the tiny random model never succeeds, so its run leaves nothing to warm start from: said so
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "warm_start.py"), "--part", "episodes", *common, "--source-steps", "1",
                           "--source-tasks", "2"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode != 0 and "no stored episode succeeded" in proc.stderr
