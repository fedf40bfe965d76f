"""The GPU path: generated tokens/s with the HF backend against vLLM, and seconds per step of
Troupe (vLLM generation) against TRL's GRPOTrainer with its colocated vLLM.

    .venv/bin/python bench/gpu.py [--part generation|step|all] [--model bundled:smollm2-135m-instruct]
                                  [--steps 6] [--warmup 1] [--tasks 8] [--k 8] [--max-new-tokens 256]

Needs CUDA and vLLM (the GPU image, docker/Dockerfile.gpu, or `pip install -r requirements-gpu.txt`);
without them it says so and exits with status 2.

Part `generation`: the same chat-templated math_tool prompts (level 1, the tool agent), k samples
each at temperature 1, at most `--max-new-tokens` tokens, stop patterns off (both engines stop at
the end-of-turn token or the limit, so they generate the same amount of work): Troupe's HF decode
loop (`training.generation.generate`) and `training.vllm_backend.VLLMGenerator` on the same `lora`
policy (the adapter served as a LoRA request), alternating, `--steps` rounds after `--warmup`.
Reports completion tokens / second for each and the ratio.

Part `step`: the single-agent `lora` task of `bench/engine_vs_trl.py --part single` on the GPU,
bf16, with vLLM generation in all three arms, one after the other (each engine owns the GPU while
it runs): Troupe's loop (`generation.backend: vllm`), synchronous (the engine sleeps
during the update) and with `generation.async: one_step_off` (a sampler thread drives the engine
during the update), and TRL's GRPOTrainer (`use_vllm=True, vllm_mode="colocate"`, the same share
of GPU memory, sleep mode on). Reports seconds per step (medians after `--warmup`) and the ratios
to TRL's.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from _common import RESULTS, SteppedRun, command_line, machine, median, table, write_json  # noqa: E402

from agents.envs import load_environment  # noqa: E402
from agents.envs._common import run_cached  # noqa: E402
from training.config import RunConfig  # noqa: E402
from training.data import load_tasks  # noqa: E402
from training.policies import build_policies  # noqa: E402
from training.rollout import Sampler  # noqa: E402
from training.seeding import seed_everything  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def config_for(args: argparse.Namespace, *, backend: str) -> RunConfig:
    return RunConfig.load(CONFIGS / "math-single.yaml").replace(**{
        "model.source": args.model,
        "topology.specialization": "lora",
        "topology.env_args": {"level": 1},
        "optim.steps": args.warmup + args.steps,
        "optim.tasks_per_step": args.tasks,
        "optim.lr": 1e-4,
        "grpo.k": args.k,
        "generation.max_new_tokens": args.max_new_tokens,
        "generation.stop_patterns": False,
        "generation.backend": backend,
        "eval.every": 0,
        "checkpoint.every": 0,
    })


def sampler_for(config: RunConfig) -> tuple[Sampler, list[Any]]:
    seed_everything(config.seed)
    env = load_environment(config.topology.environment, **config.topology.env_args)
    train_tasks, _ = load_tasks(config, env)
    return Sampler(env, build_policies(config), config, torch.Generator().manual_seed(config.seed)), train_tasks


def part_generation(args: argparse.Namespace) -> dict[str, Any]:
    from training.generation import generate
    from training.vllm_backend import VLLMGenerator

    config = config_for(args, backend="hf")
    sampler, tasks = sampler_for(config)
    agent = config.topology.order()[0]
    policy = sampler.policies.for_agent(agent)
    role = config.agent(agent).role
    prompts = []
    for tid, row in tasks[: args.tasks]:
        prompts.append(list(sampler.prompt(agent, sampler.env.reset(row, task_id=tid, roles=(role,)))[1]))
    vllm = VLLMGenerator(config, sampler.policies)
    rows: dict[str, list[tuple[float, int]]] = {"hf": [], "vllm": []}
    try:
        for i in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            with policy.active() as model:
                out = generate(model, policy.tokenizer, prompts, n=args.k, max_new_tokens=args.max_new_tokens,
                               temperature=1.0, generator=sampler.generator)
            torch.cuda.synchronize()
            hf = (time.perf_counter() - t0, sum(len(g.token_ids) for group in out for g in group))
            t0 = time.perf_counter()
            groups = vllm.generate(policy, prompts, n=args.k, max_new_tokens=args.max_new_tokens, temperature=1.0)
            fast = (time.perf_counter() - t0, sum(len(g.token_ids) for group in groups for g in group))
            print(f"round {i + 1}: hf {hf[1] / hf[0]:.0f} tok/s ({hf[0]:.2f}s) | vllm {fast[1] / fast[0]:.0f} tok/s ({fast[0]:.2f}s)", flush=True)
            if i >= args.warmup:
                rows["hf"].append(hf)
                rows["vllm"].append(fast)
    finally:
        vllm.close()
    rate = {name: median([tokens / secs for secs, tokens in r]) for name, r in rows.items()}
    print(table(["backend", "tok/s", "x HF"], [[name, f"{rate[name]:.0f}", f"{rate[name] / rate['hf']:.2f}"] for name in rows]))
    return {"tokens_per_s": rate, "rounds": rows, "prompts": len(prompts), "k": args.k, "max_new_tokens": args.max_new_tokens}


def troupe_steps(config: RunConfig, work_dir: str) -> list[float]:
    """Seconds of each of Troupe's steps generating with a vLLM engine (the plan's backend for
    `generation.backend: vllm` here), synchronous or with `generation.async`'s sampler as `config`
    says, through the product's loop (`SteppedRun`); the engine is closed after."""
    run = SteppedRun(config, work_dir, settle=False)  # a step's time: take its rollouts and update, as a run's loop does
    times: list[float] = []
    try:
        for _ in range(config.optim.steps):
            m, wall, _ = run.step()
            times.append(wall)
            print(f"troupe ({config.generation.async_}) step {m.step}: {wall:.2f}s reward {m.values['reward/total']:+.3f} "
                  f"{m.values['tokens_per_s']:.0f} tok/s", flush=True)
    finally:
        run.close()
    del run
    gc.collect()
    torch.cuda.empty_cache()
    return times


def part_step(args: argparse.Namespace) -> dict[str, Any]:
    from _trl import build_trainer
    from transformers import TrainerCallback

    config = config_for(args, backend="vllm")
    troupe = troupe_steps(config, args.work_dir)
    troupe_async = troupe_steps(config.replace(**{"generation.async": "one_step_off"}), args.work_dir)

    trl: list[float] = []

    class Clock(TrainerCallback):
        mark = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            run_cached.cache_clear()
            self.mark = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *a: Any, **k: Any) -> None:
            trl.append(time.perf_counter() - self.mark)
            print(f"trl step {state.global_step}: {trl[-1]:.2f}s", flush=True)

    sampler, tasks = sampler_for(config.replace(**{"generation.backend": "hf"}))
    trainer, reward, _ = build_trainer(config, sampler, tasks, out_dir=Path(args.work_dir) / "trl-gpu", lora=True,
                                       callbacks=[Clock()], use_vllm=True)
    trainer.train()
    reward.pool.shutdown()
    t, a, r = median(troupe[args.warmup:]), median(troupe_async[args.warmup:]), median(trl[args.warmup:])
    print(table(["engine", "s/step", "x TRL"], [["TRL GRPOTrainer + vLLM colocate", f"{r:.2f}", "1"], ["Troupe + vLLM", f"{t:.2f}", f"{t / r:.2f}"],
                                                 ["Troupe + vLLM, generation.async", f"{a:.2f}", f"{a / r:.2f}"]]))
    return {"troupe_step_s": troupe, "troupe_async_step_s": troupe_async, "trl_step_s": trl, "ratio": t / r, "async_ratio": a / r,
            "async_over_sync": a / t}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("generation", "step", "all"), default="all")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=6, help="measured rounds or steps (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=8, help="prompts per round / tasks per step")
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--work-dir", default="/tmp/troupe-bench")
    parser.add_argument("--out", default=str(RESULTS / "gpu.json"))
    args = parser.parse_args(argv)
    from training.plan import vllm_installed

    if not torch.cuda.is_available() or not vllm_installed():
        print("bench/gpu.py needs CUDA and vLLM (the GPU image, or pip install -r requirements-gpu.txt); "
              f"here: CUDA {'yes' if torch.cuda.is_available() else 'no'}, vLLM {'yes' if vllm_installed() else 'no'}", file=sys.stderr)
        return 2
    payload: dict[str, Any] = {"command": command_line(), "machine": machine(), "gpu": torch.cuda.get_device_name(0)}
    if args.part in ("generation", "all"):
        payload["generation"] = part_generation(args)
    if args.part in ("step", "all"):
        payload["step"] = part_step(args)
    write_json(Path(args.out), payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
