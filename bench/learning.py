"""Does training help? Held-out success on math_tool with the bundled model, per arm.

    .venv/bin/python bench/learning.py --arm ARM [--steps 50] [--eval-size 100] [--eval-every 10]
    .venv/bin/python bench/learning.py --report          # table + PNG from the JSON files written so far
    .venv/bin/python bench/learning.py --arm all         # every arm in turn, then the report

Arms (one JSON each under --out-dir, default bench/results/learning/):
  untrained-single  the base model as a lone tool agent (configs/math-single.yaml), evaluated only
  untrained-multi   the base model as tool -> reasoner (configs/math-prompt.yaml), evaluated only
  single            AT-GRPO, one tool agent, the whole model trained   (configs/math-single.yaml)
  prompt            AT-GRPO, two agents sharing one trained model       (configs/math-prompt.yaml)
  lora              AT-GRPO, two agents with one LoRA adapter each      (configs/math-lora.yaml)
  trl               TRL's GRPOTrainer on the `single` arm's task, model, prompts, data order and
                    settings (whole model, same lr); evaluated with Troupe's own `evaluate`

Every arm uses the same seed, the same training tasks (math_tool level `--level`, default 2) and
the same held-out set (`--eval-size` tasks generated with the held-out seed). A trained arm is
evaluated greedily every `--eval-every` steps and at the end, where it is also evaluated sampled
at the training temperature; step 0 of every arm is its untrained arm (LoRA adapters start as
the identity). Success is per agent (its own action was right) and for the team (the final answer).
Wall-clock time counts training only (rollout + update), never the evaluations, so curves of
held-out success against time compare the engines, not the evaluator. On a shared machine the
times are only comparable between arms run at the same time (run `single` and `trl` together).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, machine, table, write_json  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ARMS = ("untrained-single", "untrained-multi", "single", "prompt", "lora", "trl")
CONFIG_OF = {"untrained-single": "single", "untrained-multi": "prompt", "single": "single", "prompt": "prompt", "lora": "lora", "trl": "single"}
UNTRAINED_OF = {"single": "untrained-single", "trl": "untrained-single", "prompt": "untrained-multi", "lora": "untrained-multi"}


def result_name(arm: str, args: argparse.Namespace) -> str:
    """The arm's results file stem: `lora`; `lora-4turns` for a multi-agent arm given more turns;
    `-seed<N>` appended for a seed other than 0."""
    multi = CONFIG_OF[arm] != "single"
    name = f"{arm}-{args.max_turns}turns" if multi and args.max_turns not in (None, 2) else arm
    return f"{name}-seed{args.seed}" if args.seed else name


def base_arm(name: str) -> str:
    """`lora-4turns-seed1` -> `lora`."""
    match = re.fullmatch(r"(.+?)(?:-(\d+)turns)?(?:-seed(\d+))?", name)
    return match.group(1) if match else name


def untrained_of(name: str) -> str:
    base = UNTRAINED_OF.get(base_arm(name), "")
    return name.replace(base_arm(name), base, 1) if base else ""


def arm_config(arm: str, args: argparse.Namespace) -> Any:
    from training.config import RunConfig

    overrides: dict[str, Any] = {
        "model.source": args.model,
        "seed": args.seed,
        "topology.env_args": {"level": args.level},
        "optim.steps": max(args.steps, 1),
        "optim.tasks_per_step": args.tasks,
        "grpo.k": args.k,
        "generation.max_new_tokens": args.max_new_tokens,
        "data.eval_size": args.eval_size,
        "eval.size": args.eval_size,
        "eval.sampled": False,
        "checkpoint.every": 0,
    }
    if args.lr is not None:
        overrides["optim.lr"] = args.lr
    if args.max_turns is not None and CONFIG_OF[arm] != "single":
        overrides["topology.max_turns"] = args.max_turns
    return RunConfig.load(CONFIGS / f"math-{CONFIG_OF[arm]}.yaml").replace(**overrides)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    return {"step": result["step"], "temperature": result["temperature"], "n": result["n"], "team": result["team"]["success"],
            "agents": {a: v["success"] for a, v in result["agents"].items()}}


def evaluate_now(sampler: Any, eval_tasks: list[Any], step: int, *, sampled: bool) -> list[dict[str, Any]]:
    from training.trainer import evaluate

    config = sampler.config
    sampler.config = config.replace(**{"eval.sampled": sampled})
    try:
        return [summary(r) for r in evaluate(sampler, eval_tasks, step=step)]
    finally:
        sampler.config = config


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from agents.envs import load_environment
    from agents.envs._common import run_cached
    from training.data import load_tasks
    from training.events import NullSink
    from training.policies import build_policies
    from training.rollout import Sampler
    from training.trainer import seed_everything, train_step

    config = arm_config(arm, args)
    seed_everything(config.seed)
    env = load_environment(config.topology.environment, **config.topology.env_args)
    train_tasks, eval_tasks = load_tasks(config, env)
    sampler = Sampler(env, build_policies(config), config, torch.Generator().manual_seed(config.seed))
    payload: dict[str, Any] = {"arm": arm, "command": command_line(), "machine_start": machine(), "config": config.to_dict(),
                               "steps": 0, "train_seconds": 0.0, "curve": [], "evals": []}
    out = Path(args.out_dir) / f"{result_name(arm, args)}.json"
    t_eval = 0.0

    def checkpoint_eval(step: int, train_seconds: float, final: bool) -> None:
        nonlocal t_eval
        t0 = time.perf_counter()
        for r in evaluate_now(sampler, eval_tasks, step, sampled=final):
            payload["evals"].append({**r, "train_seconds": train_seconds})
            print(f"  eval step {step} T={r['temperature']}: team {r['team']:.3f} " + " ".join(f"{a} {v:.3f}" for a, v in r["agents"].items()), flush=True)
        t_eval += time.perf_counter() - t0
        payload["eval_seconds"] = t_eval
        write_json(out, payload)

    try:
        if arm.startswith("untrained"):
            checkpoint_eval(0, 0.0, final=True)
        elif arm == "trl":
            run_trl(config, sampler, train_tasks, args, payload, checkpoint_eval)
        else:
            train_seconds = 0.0
            for step in range(1, args.steps + 1):
                run_cached.cache_clear()
                t0 = time.perf_counter()
                m = train_step(sampler, train_tasks, step, NullSink())
                train_seconds += time.perf_counter() - t0
                payload["curve"].append(_curve_point(step, train_seconds, m.values, m.agents))
                payload["steps"], payload["train_seconds"] = step, train_seconds
                print(f"{arm} step {step}: {payload['curve'][-1]['step_time']:.1f}s reward {m.values['reward/total']:.3f} success {m.values['success']:.3f}", flush=True)
                if step == args.steps or (args.eval_every and step % args.eval_every == 0):
                    checkpoint_eval(step, train_seconds, final=step == args.steps)
    finally:
        sampler.pool.shutdown()
    payload["machine_end"] = machine()
    write_json(out, payload)
    print(f"wrote {out}")
    return payload


def _curve_point(step: int, seconds: float, values: dict[str, float], agents: dict[str, dict[str, float]]) -> dict[str, Any]:
    return {"step": step, "train_seconds": seconds, "step_time": values.get("step_time", 0.0), "reward": values["reward/total"],
            "success": values.get("success"), "agents": {a: v.get("reward/total") for a, v in agents.items()}}


def run_trl(config: Any, sampler: Any, train_tasks: list[Any], args: argparse.Namespace, payload: dict[str, Any], checkpoint_eval: Any) -> None:
    """TRL trains its own copy of the model; at each evaluation its weights are copied into the
    Troupe policy that `evaluate` generates with, so both engines are judged by the same code."""
    from _trl import build_trainer
    from transformers import TrainerCallback

    from agents.envs._common import run_cached

    policy = sampler.policies.for_agent(config.topology.order()[0])

    class Track(TrainerCallback):
        mark = 0.0
        train_seconds = 0.0

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            run_cached.cache_clear()
            self.mark = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *a: Any, **k: Any) -> None:
            wall = time.perf_counter() - self.mark
            self.train_seconds += wall
            step, call = state.global_step, reward.calls[-1]
            payload["curve"].append({"step": step, "train_seconds": self.train_seconds, "step_time": wall, "reward": call["reward"],
                                     "success": None, "agents": {}})
            payload["steps"], payload["train_seconds"] = step, self.train_seconds
            print(f"trl step {step}: {wall:.1f}s reward {call['reward']:.3f}", flush=True)
            if step == args.steps or (args.eval_every and step % args.eval_every == 0):
                policy.model.load_state_dict(trainer.model.state_dict())
                checkpoint_eval(step, self.train_seconds, final=step == args.steps)
            run_cached.cache_clear()
            self.mark = time.perf_counter()

    trainer, reward, _ = build_trainer(config, sampler, train_tasks, out_dir=Path(args.work_dir) / "trl-learning", lora=False, callbacks=[Track()])
    trainer.train()
    reward.pool.shutdown()


# == report ========================================================================================


def report(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    found = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json") if base_arm(p.stem) in ARMS}
    runs = dict(sorted(found.items(), key=lambda kv: (ARMS.index(base_arm(kv[0])), kv[0])))
    if not runs:
        print(f"no arm results in {out_dir}; run --arm first", file=sys.stderr)
        return 1
    rows = []
    for arm, run in runs.items():
        evals = run["evals"]
        greedy = [e for e in evals if e["temperature"] == 0.0]
        last_greedy = greedy[-1] if greedy else None
        sampled = [e for e in evals if e["temperature"] > 0.0]
        base = runs.get(untrained_of(arm))
        base_greedy = next((e for e in base["evals"] if e["temperature"] == 0.0), None) if base else None
        agents = last_greedy["agents"] if last_greedy else {}
        delta = (last_greedy["team"] - base_greedy["team"]) * 100 if last_greedy and base_greedy else None
        rows.append([
            arm, run["steps"], f"{run['train_seconds'] / 60:.1f}", last_greedy["n"] if last_greedy else "-",
            f"{last_greedy['team']:.3f}" if last_greedy else "-", f"{delta:+.1f}" if delta is not None else "-",
            f"{sampled[-1]['team']:.3f}" if sampled else "-",
            " ".join(f"{a} {v:.2f}" for a, v in agents.items()) or "-",
            " ".join(f"{a} {v:.2f}" for a, v in sampled[-1]["agents"].items()) if sampled else "-",
        ])
    headers = ["arm", "steps", "train min", "held-out n", "greedy team", "vs untrained (pts)", "sampled team", "greedy per agent", "sampled per agent"]
    text = table(headers, rows)
    print(text)
    png = out_dir / "learning.png"
    _plot(runs, png)
    payload = {"command": command_line(), "table": text, "arms": {a: {k: r[k] for k in ("steps", "train_seconds", "evals")} for a, r in runs.items()}}
    write_json(out_dir / "report.json", payload)
    print(f"\nwrote {png} and {out_dir / 'report.json'}")
    return 0


def _plot(runs: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm, run in runs.items():
        curve = run.get("curve") or []
        if curve:
            steps = [c["step"] for c in curve]
            rewards = [c["reward"] for c in curve]
            window = 5
            smooth = [sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1]) for i in range(len(rewards))]
            ax1.plot(steps, smooth, label=arm)
        greedy = [e for e in run["evals"] if e["temperature"] == 0.0]
        base = runs.get(untrained_of(arm))
        start = [e for e in base["evals"] if e["temperature"] == 0.0][:1] if base and not arm.startswith("untrained") else []
        points = [(e["train_seconds"] / 60, e["team"]) for e in start + greedy]
        if points and not arm.startswith("untrained"):
            ax2.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=arm)
        elif points:
            ax2.axhline(points[0][1], linestyle=":", color="grey" if base_arm(arm).endswith("single") else "black", label=arm)
    ax1.set(title="Training reward (mean over the step's candidates, 5-step average)", xlabel="step", ylabel="reward")
    ax2.set(title="Held-out team success, greedy", xlabel="training wall-clock (min, evaluations excluded)", ylabel="success", ylim=(0, 1))
    for ax, where in ((ax1, "best"), (ax2, "lower right")):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc=where)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", choices=(*ARMS, "all"))
    parser.add_argument("--report", action="store_true", help="assemble the table and PNG from the JSON files")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--level", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50, help="training steps N")
    parser.add_argument("--eval-size", type=int, default=100, help="held-out tasks")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--k", type=int, default=4, help="group size")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: the arm's config (single/prompt 2e-5, lora 2e-4)")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="multi-agent arms: turns per episode (default: the config's 2, tool then reasoner; 4 lets the tool retry once "
                             "after the reasoner disagrees); results go to ARM-Nturns.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--work-dir", default="/tmp/troupe-bench")
    parser.add_argument("--out-dir", default=str(RESULTS / "learning"))
    args = parser.parse_args(argv)
    if not args.arm and not args.report:
        parser.error("give --arm ARM or --report")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for arm in ARMS if args.arm == "all" else [args.arm] if args.arm else []:
        run_arm(arm, args)
    if args.report or args.arm == "all":
        return report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
