"""Speed of Troupe's engine against TRL's GRPOTrainer, and of the multi-agent specializations.

    .venv/bin/python bench/engine_vs_trl.py [--steps 6] [--warmup 1] [--level 1] [--threads N]
                                           [--part single|multi|all] [--out bench/results/engine_vs_trl.json]

Part `single` (Troupe against TRL). One task, one model, one process, steps interleaved:
- math_tool, one `tool` agent (the `math-single` topology), bundled SmolLM2-135M-Instruct, fp32 on CPU.
- The same prompts: Troupe's chat-templated prompt (its role instructions as the system message,
  the observation as the user message); TRL gets the same messages as a conversational dataset,
  in Troupe's batch order (`shuffle_dataset=False`), so step i of both trains on the same tasks.
  The script checks that TRL's tokenization of each prompt equals Troupe's.
- The same update: a LoRA adapter (peft LoraConfig, same r, alpha, dropout, target modules) on a
  frozen base; Troupe's `lora` specialization with this one agent; group size k, tasks per step,
  max completion length, temperature 1, lr, AdamW betas (0.9, 0.99), no weight decay, grad clip
  1.0, constant lr, `dapo` loss, eps 0.2/0.28, beta 0 (no reference pass), one iteration,
  micro-batches of 8 (TRL: per_device_train_batch_size 8 x gradient_accumulation_steps 2, so one
  generation of tasks*k completions per optimizer step), no gradient checkpointing, fp32.
- The same reward: TRL's reward function runs math_tool's `env.step` (the sandboxed program) for
  each completion, in a 4-thread pool as Troupe's sampler does, and returns alpha*team + local.
  The sandbox cache is cleared before every step of every arm.
- Stopping: TRL has no regex stop; both stop at the end-of-turn token or `max_new_tokens`. Troupe
  runs twice: with math_tool's stop patterns (ends the action at the closing code fence) and
  without (`generation.stop_patterns=false`, the like-for-like arm).
- The async arm (`generation.async: one_step_off`, stop patterns on): a sampler process makes the
  next step's rollouts during the update (`training.async_rollout`), on a second core. Its step
  ends only when the next step's rollouts are done too (`settle`), so it never runs beside the
  other arms: its wall time per step is what a run of such steps costs; its CPU time counts both
  processes. With `--threads 1` it uses two cores where the other arms use one: that is the point.
  A second async arm runs its sampler in a thread of the trainer's process instead (what a GPU
  run gets), so the two are compared in the same run.
- The bf16 arms (`generation.dtype: bfloat16`, stop patterns on): the rollouts come from a bfloat16
  copy of the weights, refreshed before each step's rollouts, and the update corrects its numbers
  with truncated importance sampling (as for vLLM); synchronous, and async with the sampler process.
  And the bf16-base arms (`model.dtype: bfloat16`): the frozen base in bfloat16, the LoRA adapters
  in fp32 (peft keeps them so), the same weights sampling and training (exact, no correction).
  `--no-bf16` leaves all four out.
- The llama.cpp arms (`generation.backend: llamacpp`, stop patterns on): Troupe's sampler over
  llama.cpp's logits, the LoRA adapter merged into the base in a mapped GGUF file after each update
  (`training.llamacpp_backend`), importance-corrected; in F32 and BF16 (`generation.dtype`), and the
  BF16 ones async (its sampler a thread: the engine lives in the trainer's process); BF16 over the
  fp32 adapters on a bf16 base too (`model.dtype: bfloat16`, GGUF BF16: the trainer's own dtype).
  `--no-llamacpp` leaves them out; `--arms REGEX` keeps only the Troupe arms it names.
- Interleaving: TRL's trainer runs; after each of its optimizer steps a callback runs one step of
  each Troupe arm. A TRL step's time is the wall time between its step ends minus the Troupe
  time spent in between, so it counts everything TRL does per step. Medians over the steps after
  `--warmup`. Generated tokens/s = completion tokens / generation seconds (TRL: time inside its
  `_generate_single_turn`; Troupe: its own generation timer).
- Wall time and CPU time (user + system of the process and its sandbox children) per step. On a
  shared machine wall time swings with the neighbours' load; with `--threads 1` CPU time is the
  work each engine did, so `x TRL (cpu)` is the steadier ratio (but not steady: a neighbour on the
  other core slows this one's memory-bound work too, see docs/benchmarks.md).
- Reproducibility: each step records the 1-minute load average when it ends; each arm's summary
  gives the median, and the smallest and largest per-step ratio to TRL's step of the same round
  (`ratio_min`, `ratio_max`): how much the figure moves within the run.

Part `multi`: the two-agent math_tool topology (tool then reasoner, tree sampling) under `prompt`,
`lora` and `full`, interleaved step by step: seconds per step, rollout/update split, tokens/s.

The machine is shared: compare the ratios, and read `machine.loadavg` in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import RESULTS, SteppedRun, command_line, cpu_seconds, machine, median, table, write_json  # noqa: E402

from agents.envs._common import run_cached  # noqa: E402
from training.config import RunConfig  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def troupe_config(name: str, args: argparse.Namespace, **overrides: Any) -> RunConfig:
    base = {
        "topology.env_args": {"level": args.level},
        "generation.max_new_tokens": args.max_new_tokens,
        "generation.temperature": 1.0,
        "generation.backend": "hf",  # the HF arms, whatever `auto` picks on this host; the llama.cpp arms say so
        "grpo.k": args.k,
        "grpo.loss_type": "dapo",
        "grpo.beta": 0.0,
        "grpo.num_iterations": 1,
        "optim.tasks_per_step": args.tasks,
        "optim.steps": args.warmup + args.steps,
        "optim.lr": args.lr,
        "optim.micro_batch_size": 8,
        "model.source": args.model,
        "eval.every": 0,
        "checkpoint.every": 0,
    }
    base.update(overrides)
    return RunConfig.load(CONFIGS / f"math-{name}.yaml").replace(**base)


class TroupeArm:
    """One Troupe configuration, run through the product's loop one step at a time (`SteppedRun`);
    records wall time, CPU time and generation stats per step."""

    def __init__(self, name: str, config: RunConfig, args: argparse.Namespace):
        self.name, self.config = name, config
        self.run = SteppedRun(config, Path(args.work_dir) / "troupe")
        self.sampler, self.tasks = self.run.parts.sampler, self.run.parts.train_tasks
        self.steps: list[dict[str, float]] = []

    def step(self) -> float:
        metrics, wall, cpu = self.run.step()
        m = metrics.values
        secs = m["generated_tokens"] / m["tokens_per_s"] if m["tokens_per_s"] else 0.0
        self.steps.append(
            {
                "step_time": wall,
                "step_cpu": cpu,
                "rollout_time": m["rollout_time"],
                "update_time": m["update_time"],
                "generated_tokens": m["generated_tokens"],
                "generation_time": secs,
                "reward": m["reward/total"],
                "completion_len": m["completion_len"],
                "load_1min": os.getloadavg()[0],
            }
        )
        return wall

    def close(self) -> None:
        self.run.close()


def summarize(steps: list[dict[str, float]], warmup: int, trl: list[dict[str, float]] | None = None) -> dict[str, float]:
    kept = steps[warmup:] or steps
    ratios = [s["step_time"] / t["step_time"] for s, t in zip(kept, (trl[warmup:] or trl))] if trl else []
    gen_tokens = sum(s["generated_tokens"] for s in kept)
    gen_secs = sum(s["generation_time"] for s in kept)
    return {
        "steps": len(kept),
        "step_time_median": median([s["step_time"] for s in kept]),
        "step_cpu_median": median([s["step_cpu"] for s in kept]),
        "step_time_mean": statistics.fmean(s["step_time"] for s in kept),
        "rollout_time_median": median([s["rollout_time"] for s in kept]),
        "update_time_median": median([s["update_time"] for s in kept]),
        "gen_tokens_per_s": gen_tokens / gen_secs if gen_secs else float("nan"),
        "step_tokens_per_s": gen_tokens / sum(s["step_time"] for s in kept),
        "completion_len_mean": statistics.fmean(s["completion_len"] for s in kept),
        "reward_mean": statistics.fmean(s["reward"] for s in kept),
        "ratio_min": min(ratios, default=float("nan")),
        "ratio_max": max(ratios, default=float("nan")),
        "load_1min": [min(s["load_1min"] for s in kept), median([s["load_1min"] for s in kept]), max(s["load_1min"] for s in kept)],
    }


# == part single: Troupe against TRL ==============================================================


def run_single(args: argparse.Namespace) -> dict[str, Any]:
    from _trl import build_trainer
    from transformers import TrainerCallback

    one_agent = {"specialization": "lora", "agents": [{"name": "tool", "role": "tool"}], "turn_order": ["tool"], "max_turns": 1}
    topo = {f"topology.{k}": v for k, v in one_agent.items()}
    base = troupe_config("single", args, **topo)
    specs = [("troupe (stop patterns)", base),
             ("troupe (no stop patterns)", troupe_config("single", args, **topo, **{"generation.stop_patterns": False}))]
    async_cfg = troupe_config("single", args, **topo, **{"generation.async": "one_step_off"})
    if not args.no_async:
        specs.append(("troupe async (stop patterns)", async_cfg))  # a sampler process: what a CPU run gets
        specs.append(("troupe async thread (stop patterns)", async_cfg.replace(**{"generation.async_sampler": "thread"})))
    if not args.no_bf16:  # rollouts from a bfloat16 copy (generation.dtype), importance-corrected
        specs.append(("troupe bf16 copy (stop patterns)", base.replace(**{"generation.dtype": "bfloat16"})))
        if not args.no_async:
            specs.append(("troupe async bf16 copy (stop patterns)", async_cfg.replace(**{"generation.dtype": "bfloat16"})))
        # the LoRA adapters (fp32: peft keeps them so) on a bfloat16 base (model.dtype): the sampler is the trainer, exact
        specs.append(("troupe bf16 base (stop patterns)", base.replace(**{"model.dtype": "bfloat16"})))
        if not args.no_async:
            specs.append(("troupe async bf16 base (stop patterns)", async_cfg.replace(**{"model.dtype": "bfloat16"})))
    if not args.no_llamacpp:  # llama.cpp's kernels over the merged weights, importance-corrected
        llama = {"generation.backend": "llamacpp"}
        specs.append(("troupe llama.cpp f32 (stop patterns)", base.replace(**llama)))
        specs.append(("troupe llama.cpp bf16 (stop patterns)", base.replace(**llama, **{"generation.dtype": "bfloat16"})))
        specs.append(("troupe llama.cpp bf16 base (stop patterns)", base.replace(**llama, **{"model.dtype": "bfloat16"})))
        if not args.no_async:
            specs.append(("troupe async llama.cpp f32 (stop patterns)", async_cfg.replace(**llama)))
            specs.append(("troupe async llama.cpp bf16 (stop patterns)", async_cfg.replace(**llama, **{"generation.dtype": "bfloat16"})))
            specs.append(("troupe async llama.cpp bf16 base (stop patterns)", async_cfg.replace(**llama, **{"model.dtype": "bfloat16"})))
    keep = re.compile(args.arms) if args.arms else None  # the first arm always runs: TRL reads its sampler and tasks
    arms = [TroupeArm(name, config, args) for i, (name, config) in enumerate(specs) if i == 0 or keep is None or keep.search(name)]
    cfg = arms[0].config
    trl_steps: list[dict[str, float]] = []

    class Interleave(TrainerCallback):
        """After each TRL optimizer step, one step of each Troupe arm; TRL's own time excludes them."""

        mark = cpu_mark = 0.0

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            run_cached.cache_clear()
            self.mark, self.cpu_mark = time.perf_counter(), cpu_seconds()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            wall, cpu = time.perf_counter() - self.mark, cpu_seconds() - self.cpu_mark
            call = reward.calls[-1]
            trl_steps.append(
                {
                    "step_time": wall,
                    "step_cpu": cpu,
                    "rollout_time": float("nan"),
                    "update_time": float("nan"),
                    "generated_tokens": call["tokens"],
                    "generation_time": take_gen_secs(),
                    "reward": call["reward"],
                    "completion_len": call["completion_len"],
                    "load_1min": os.getloadavg()[0],
                }
            )
            times = [arm.step() for arm in arms]
            print(f"step {len(trl_steps)}: trl {wall:.1f}s ({cpu:.1f} cpu-s) | "
                  + " | ".join(f"{a.name} {t:.1f}s ({a.steps[-1]['step_cpu']:.1f} cpu-s)" for a, t in zip(arms, times)), flush=True)
            run_cached.cache_clear()
            self.mark, self.cpu_mark = time.perf_counter(), cpu_seconds()

    trainer, reward, take_gen_secs = build_trainer(
        cfg, arms[0].sampler, arms[0].tasks, out_dir=Path(args.work_dir) / "trl", lora=True, callbacks=[Interleave()]
    )
    trainer.train()
    reward.pool.shutdown()
    for arm in arms:
        arm.close()

    results = {"trl": summarize(trl_steps, args.warmup, trl_steps)}
    results.update({arm.name: summarize(arm.steps, args.warmup, trl_steps) for arm in arms})
    trl_time, trl_cpu = results["trl"]["step_time_median"], results["trl"]["step_cpu_median"]
    for name in results:
        results[name]["ratio_to_trl"] = results[name]["step_time_median"] / trl_time
        results[name]["cpu_ratio_to_trl"] = results[name]["step_cpu_median"] / trl_cpu
    lc = cfg.lora
    return {
        "setup": {
            "task": f"math_tool level {args.level}, tool agent only",
            "model": args.model,
            "tasks_per_step": cfg.optim.tasks_per_step,
            "k": cfg.grpo.k,
            "completions_per_step": cfg.optim.tasks_per_step * cfg.grpo.k,
            "max_new_tokens": cfg.generation.max_new_tokens,
            "lora": {"r": lc.r, "alpha": lc.alpha, "target_modules": list(lc.target_modules)},
            "lr": cfg.optim.lr,
            "prompt_tokens_match": True,
        },
        "arms": results,
        "per_step": {"trl": trl_steps, **{arm.name: arm.steps for arm in arms}},
    }


# == part multi: the specializations ===============================================================


def run_multi(args: argparse.Namespace) -> dict[str, Any]:
    specs = []
    for spec in ("prompt", "lora", "full"):  # each specialization beside its llama.cpp F32 twin (built next to it)
        specs.append((spec, troupe_config(spec, args)))
        if not args.no_llamacpp:
            specs.append((f"{spec} llama.cpp f32", troupe_config(spec, args, **{"generation.backend": "llamacpp"})))
    keep = re.compile(args.arms) if args.arms else None
    arms = [TroupeArm(name, config, args) for name, config in specs if keep is None or keep.search(name)]
    for step in range(1, args.warmup + args.steps + 1):
        times = [arm.step() for arm in arms]
        print(f"step {step}: " + " | ".join(f"{a.name} {t:.1f}s" for a, t in zip(arms, times)), flush=True)
    for arm in arms:
        arm.close()
    return {
        "setup": {"task": f"math_tool level {args.level}, tool -> reasoner, tree sampling", "k": args.k, "tasks_per_step": args.tasks, "max_new_tokens": args.max_new_tokens},
        "arms": {arm.name: summarize(arm.steps, args.warmup) for arm in arms},
        "per_step": {arm.name: arm.steps for arm in arms},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("single", "multi", "all"), default="all")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--steps", type=int, default=6, help="measured steps per arm (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--k", type=int, default=4, help="group size")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--no-async", action="store_true", help="leave out the async arms (generation.async: one_step_off, its sampler a process and a thread)")
    parser.add_argument("--arms", default="", help="only the Troupe arms whose name this regex finds (part single: the first, "
                        "`troupe (stop patterns)`, always runs)")
    parser.add_argument("--no-llamacpp", action="store_true", help="leave out the arms generating with llama.cpp (generation.backend: llamacpp)")
    parser.add_argument("--no-bf16", action="store_true", help="leave out the arms sampling from a bfloat16 copy (generation.dtype: bfloat16)")
    parser.add_argument("--work-dir", default="/tmp/troupe-bench")
    parser.add_argument("--out", default=str(RESULTS / "engine_vs_trl.json"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    # one part at a time keeps the other part's latest figures in the same file
    payload: dict[str, Any] = json.loads(out.read_text()) if out.is_file() and args.part != "all" else {}
    payload.pop("command", None)
    t0 = time.perf_counter()
    if args.part in ("single", "all"):
        payload["single"] = {"command": command_line(), "machine_start": machine(), **run_single(args), "machine_end": machine()}
        rows = [
            [name, r["step_time_median"], r["ratio_to_trl"], f"{r.get('ratio_min', 1.0):.2f}-{r.get('ratio_max', 1.0):.2f}",
             r["step_cpu_median"], r["cpu_ratio_to_trl"], r["gen_tokens_per_s"], r["step_tokens_per_s"], r["completion_len_mean"],
             r["reward_mean"]]
            for name, r in payload["single"]["arms"].items()
        ]
        load = payload["single"]["arms"]["trl"]["load_1min"]
        print(f"\nSingle agent, {payload['single']['setup']['task']}, {payload['single']['setup']['completions_per_step']} completions/step, "
              f"medians of {args.steps} steps, load average {load[0]:.1f}-{load[2]:.1f} (median {load[1]:.1f})")
        print(table(["arm", "wall s/step", "x TRL", "x TRL per step", "cpu s/step", "x TRL (cpu)", "gen tok/s", "step tok/s", "mean len",
                     "reward"], rows))
    if args.part in ("multi", "all"):
        payload["multi"] = {"command": command_line(), "machine_start": machine(), **run_multi(args), "machine_end": machine()}
        rows = [
            [name, r["step_time_median"], r["step_cpu_median"], r["rollout_time_median"], r["update_time_median"], r["gen_tokens_per_s"], r["step_tokens_per_s"]]
            for name, r in payload["multi"]["arms"].items()
        ]
        print(f"\nTwo agents, {payload['multi']['setup']['task']}, medians of {args.steps} steps")
        print(table(["specialization", "wall s/step", "cpu s/step", "rollout s", "update s", "gen tok/s", "step tok/s"], rows))
    payload["wall_s"] = time.perf_counter() - t0
    print(f"\nwrote {write_json(out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
