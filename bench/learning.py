"""Does training help, and does the team matter? Held-out success with the bundled model, per arm and seed.

    .venv/bin/python bench/learning.py --arm ARM [--seed 0] [--steps 50] [--eval-size 100] [--eval-every 10]
    .venv/bin/python bench/learning.py --report          # table + PNG from the JSON files written so far
    .venv/bin/python bench/learning.py --arm all         # every arm in turn, then the report

The task: `--env math_tool --level L` (default level 2; `--level 2,3` mixes levels 2 and 3 at
random, task by task; the tool agent writes a program, the
reasoner checks it and answers) or `--env plan_path --size S` (the tool agent writes a search
program, the planner states the moves). The lone agent of the single arms is `--single-role`
(default: the tool for math_tool, the planner for plan_path).

Arms (one JSON each under --out-dir; default bench/results/learning/ for math_tool level 2, else
bench/results/learning/<env>-<level or size>/):
  untrained-single  the base model as the lone agent, evaluated only
  untrained-multi   the base model as the two-agent team, evaluated only (and with its roles swapped)
  untrained-self    the base model as the lone agent given the team's turns (`self_correct`), evaluated only
  single            AT-GRPO, the lone agent, the whole model trained
  single-async      `single` with one-step-off-policy rollouts (`generation.async: one_step_off`): a
                    sampler process generates step t+1 with the weights of step t-1 while step t updates
  self              AT-GRPO, the lone agent given the team's turns: it sees its last attempt and
                    tries again until it repeats its answer (the environment's `self_correct`)
  prompt            AT-GRPO, the team sharing one trained model, roles differ by prompt
  lora              AT-GRPO, the team with one LoRA adapter per agent on a frozen base
  alone             each agent's LoRA adapter trained with that agent alone (`--steps` each), then
                    put together as a `lora` team and evaluated (the paper's "trained alone" ablation)
  trl               TRL's GRPOTrainer on the `single` arm's task, model, prompts, data order and
                    settings (whole model, same lr); evaluated with Troupe's own `evaluate`

Every arm and every seed is evaluated on the same held-out tasks (`--eval-size` tasks generated
with the held-out seed of `--eval-seed`, not of `--seed`), so seeds differ in training tasks,
samples and initial adapters only. A trained arm is evaluated greedily every `--eval-every` steps
and at the end, where it is also evaluated sampled at the training temperature; a team arm is then
also evaluated with its roles swapped (`prompt`: the two agents exchange their role prompts;
`lora`/`alone`: the two agents exchange their adapters; greedy). Step 0 of every trained arm is its
untrained arm (LoRA adapters start as the identity). Team success = the environment's verdict on
the episode; an agent's success = the same verdict on the episodes it acted in.
Every curve point and evaluation records the tokens generated in training so far, so arms are
compared at equal steps and at equal generated tokens (a team writes more per step).
Wall-clock time counts training only (rollout + update), never the evaluations. On a shared
machine the times are only comparable between arms run at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, cpu_seconds, machine, table, write_json  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
ARMS = ("untrained-single", "untrained-self", "untrained-multi", "single", "single-async", "self", "prompt", "lora", "alone", "trl")
SPEC_OF = {"untrained-single": "single", "untrained-self": "single", "untrained-multi": "prompt", "single": "single",
           "single-async": "single", "self": "single",
           "prompt": "prompt", "lora": "lora", "alone": "lora", "trl": "single"}
UNTRAINED_OF = {"single": "untrained-single", "single-async": "untrained-single", "trl": "untrained-single", "self": "untrained-self", "prompt": "untrained-multi",
                "lora": "untrained-multi", "alone": "untrained-multi"}
TEAM_ROLES = {"math_tool": ("tool", "reasoner"), "plan_path": ("tool", "plan")}
"""The two roles of each environment's team, in turn order."""
SINGLE_ROLE = {"math_tool": "tool", "plan_path": "plan"}


def is_team(arm: str) -> bool:
    return SPEC_OF[arm] != "single"


def team_turns(args: argparse.Namespace) -> int:
    return args.max_turns or 2


def result_name(arm: str, args: argparse.Namespace) -> str:
    """The arm's results file stem: `lora`; `lora-4turns` for an arm given other than 2 team turns
    (the team arms, and the lone agent given the team's turns); `-seed<N>` for a seed other than 0."""
    turns = is_team(arm) or arm in ("self", "untrained-self")
    name = f"{arm}-{team_turns(args)}turns" if turns and team_turns(args) != 2 else arm
    return f"{name}-seed{args.seed}" if args.seed else name


def base_arm(name: str) -> str:
    """`lora-4turns-seed1` -> `lora`."""
    match = re.fullmatch(r"(.+?)(?:-(\d+)turns)?(?:-seed(\d+))?", name)
    return match.group(1) if match else name


def group_of(name: str) -> str:
    """`lora-4turns-seed1` -> `lora-4turns`: the runs that differ only by seed."""
    return re.sub(r"-seed\d+$", "", name)


def untrained_of(group: str) -> str:
    base = UNTRAINED_OF.get(base_arm(group), "")
    return group.replace(base_arm(group), base, 1) if base else ""


def default_out_dir(args: argparse.Namespace) -> Path:
    if args.env == "math_tool" and args.level == 2:
        return RESULTS / "learning"
    levels = args.level if isinstance(args.level, list) else [args.level]
    tag = f"level{'+'.join(map(str, levels))}" if args.env == "math_tool" else f"size{args.size}"
    return RESULTS / "learning" / f"{args.env}-{tag}"


def env_args(args: argparse.Namespace, *, self_correct: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"level": args.level} if args.env == "math_tool" else {"size": args.size}
    if self_correct:
        out["self_correct"] = True
    return out


def arm_config(arm: str, args: argparse.Namespace, *, roles: tuple[str, ...] | None = None) -> Any:
    """The arm's RunConfig: `configs/math-<spec>.yaml` with the task, the agents and the knobs
    replaced. `roles` overrides the acting roles (the `alone` arm trains one role at a time)."""
    from training.config import RunConfig

    spec = SPEC_OF[arm]
    if roles is None:
        roles = TEAM_ROLES[args.env] if is_team(arm) else (args.single_role or SINGLE_ROLE[args.env],)
    lone_turns = arm in ("self", "untrained-self")
    overrides: dict[str, Any] = {
        "model.source": args.model,
        "seed": args.seed,
        "topology.environment": args.env,
        "topology.env_args": env_args(args, self_correct=lone_turns),
        "topology.agents": [{"name": r, "role": r} for r in roles],
        "topology.turn_order": list(roles),
        "topology.max_turns": team_turns(args) if len(roles) > 1 or lone_turns else 1,
        "optim.steps": max(args.steps, 1),
        "optim.tasks_per_step": args.tasks,
        "grpo.k": args.k,
        "generation.max_new_tokens": args.max_new_tokens,
        "data.eval_size": args.eval_size,
        "data.eval_seed": args.eval_seed,  # every arm and seed judged on the same held-out tasks
        "eval.size": args.eval_size,
        "eval.every": args.eval_every or max(args.steps, 1),  # 0: at the end only
        "eval.sampled": False,  # sampled at the end only (`evaluate_now`)
        "checkpoint.every": 0,
    }
    if args.lr is not None:
        overrides["optim.lr"] = args.lr
    if arm == "single-async":
        overrides["generation.async"] = "one_step_off"
    return RunConfig.load(CONFIGS / f"math-{spec}.yaml", list(args.set)).replace(**overrides)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    return {"step": result["step"], "temperature": result["temperature"], "n": result["n"], "team": result["team"]["success"],
            "agents": {a: v["success"] for a, v in result["agents"].items()},
            "agent_reward": {a: v["reward"] for a, v in result["agents"].items()}}


def roles_swapped(sampler: Any) -> Any:
    """The two agents of a team exchange what makes them differ, for an evaluation: the engine's
    role swap (`training.ablation.roles_swapped`): `prompt` exchanges the role prompts, `lora`/`full`
    the adapters or models. The environment still asks each role for its own action, so a swapped
    team is the trained weights playing the roles they were not trained for."""
    from training.ablation import roles_swapped as engine_roles_swapped

    return engine_roles_swapped(sampler)


def evaluate_now(sampler: Any, eval_tasks: list[Any], step: int, *, sampled: bool) -> list[dict[str, Any]]:
    from training.evaluation import evaluate

    config = sampler.config
    sampler.config = config.replace(**{"eval.sampled": sampled})
    try:
        return [summary(r) for r in evaluate(sampler, eval_tasks, step=step)]
    finally:
        sampler.config = config


class Recorder:
    """The arm's JSON: curve points, evaluations (with training time and tokens so far), machine load."""

    def __init__(self, arm: str, config: Any, out: Path) -> None:
        self.out = out
        self.payload: dict[str, Any] = {"arm": arm, "command": command_line(), "machine_start": machine(), "config": config.to_dict(),
                                        "steps": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0, "train_tokens": 0, "curve": [], "evals": [],
                                        "eval_seconds": 0.0, "eval_cpu_seconds": 0.0}

    def step(self, step: int, seconds: float, values: dict[str, float], agents: dict[str, dict[str, float]], *,
             cpu: float = 0.0, **extra: Any) -> None:
        p = self.payload
        p["steps"], p["train_seconds"] = step, p["train_seconds"] + seconds
        p["train_cpu_seconds"] = p.get("train_cpu_seconds", 0.0) + cpu
        p["train_tokens"] += int(values.get("generated_tokens", 0))
        p["curve"].append({"step": step, "train_seconds": p["train_seconds"], "train_tokens": p["train_tokens"], "step_time": seconds,
                           "reward": values["reward/total"], "success": values.get("success"),
                           "agents": {a: v.get("reward/total") for a, v in agents.items()}, **extra})

    def add_train_time(self, seconds: float, cpu: float) -> None:
        """Training time spent outside a step (an async run finishing its next batch before an evaluation)."""
        p = self.payload
        p["train_seconds"] += seconds
        p["train_cpu_seconds"] = p.get("train_cpu_seconds", 0.0) + cpu
        if p["curve"]:
            p["curve"][-1]["train_seconds"] = p["train_seconds"]

    def evaluate(self, sampler: Any, eval_tasks: list[Any], step: int, *, final: bool, swap: bool = False) -> None:
        t0, c0 = time.perf_counter(), cpu_seconds()
        before = sampler.stats.tokens
        results = evaluate_now(sampler, eval_tasks, step, sampled=final)
        if final and swap:
            with roles_swapped(sampler):
                results += [{**r, "swapped": True} for r in evaluate_now(sampler, eval_tasks, step, sampled=False)]
        sampler.stats.tokens = before  # evaluation tokens are not training tokens
        p = self.payload
        for r in results:
            p["evals"].append({**r, "train_seconds": p["train_seconds"], "train_tokens": p["train_tokens"]})
            print(f"  eval step {step} T={r['temperature']}{' swapped' if r.get('swapped') else ''}: team {r['team']:.3f} "
                  + " ".join(f"{a} {v:.3f}" for a, v in r["agents"].items()), flush=True)
        p["eval_seconds"] += time.perf_counter() - t0
        p["eval_cpu_seconds"] = p.get("eval_cpu_seconds", 0.0) + cpu_seconds() - c0
        write_json(self.out, p)


def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out_dir) / f"{result_name(arm, args)}.json"
    config = arm_config(arm, args)
    rec = Recorder(arm, config, out)
    if arm == "alone":
        run_alone(args, rec)
    elif arm.startswith("untrained"):
        with base_sampler(config) as (sampler, _, eval_tasks):
            rec.evaluate(sampler, eval_tasks, 0, final=True, swap=is_team(arm))
    elif arm == "trl":
        with base_sampler(config) as (sampler, train_tasks, eval_tasks):
            run_trl(config, sampler, train_tasks, args, rec, eval_tasks)
    else:
        with train(config, args, rec, label=arm, swap=is_team(arm)):
            pass  # the run's evaluations were its hooks'; its policies are not needed after it
    rec.payload["machine_end"] = machine()
    write_json(out, rec.payload)
    print(f"wrote {out}")
    return rec.payload


@contextlib.contextmanager
def base_sampler(config: Any) -> Iterator[tuple[Any, list[Any], list[Any]]]:
    """The base models acting on the config's tasks, as the product evaluates a run's base models
    (`training.rollout.checkpoint_sampler`): (sampler, training tasks, held-out tasks)."""
    from agents.envs import load_environment
    from training.data import load_tasks
    from training.rollout import checkpoint_sampler
    from training.seeding import seed_everything

    seed_everything(config.seed)
    env = load_environment(config.topology.environment, **config.topology.env_args)
    train_tasks, eval_tasks = load_tasks(config, env)
    with checkpoint_sampler(config, env, None) as sampler:
        yield sampler, train_tasks, eval_tasks


@contextlib.contextmanager
def train(config: Any, args: argparse.Namespace, rec: Recorder, *, label: str, swap: bool = False, evaluate: bool = True,
          **extra: Any) -> Iterator[Any]:
    """Train `config` through the product's loop (`training.trainer.setup` + `loop`, as a run on the
    worker does), recording each step and each held-out evaluation through the loop's hooks; yields
    the run's parts (their trained policies) before they are closed. Each step rolls out from an
    empty sandbox cache. Step 0 is not evaluated (the arm's untrained arm is its step 0), and
    `evaluate=False` skips every evaluation (the `alone` arm evaluates the assembled team only)."""
    from agents.envs._common import run_cached
    from training.events import NullSink
    from training.trainer import Hooks, loop, setup

    mark = {"t": 0.0, "cpu": 0.0}

    def before_step(step: int) -> None:
        run_cached.cache_clear()
        mark.update(t=time.perf_counter(), cpu=cpu_seconds())

    def after_step(m: Any) -> None:
        rec.step(m.step, time.perf_counter() - mark["t"], m.values, m.agents, cpu=cpu_seconds() - mark["cpu"], **extra,
                 **({"staleness": m.values["async/staleness"]} if "async/staleness" in m.values else {}))
        write_json(rec.out, rec.payload)
        print(f"{label} step {m.step}: {rec.payload['curve'][-1]['step_time']:.1f}s reward {m.values['reward/total']:.3f} "
              f"success {m.values['success']:.3f} tokens {rec.payload['train_tokens']}", flush=True)
        mark.update(t=time.perf_counter(), cpu=cpu_seconds())

    def held_out(parts: Any, step: int, final: bool) -> list[dict[str, Any]]:
        if step == 0 or not evaluate:
            return []
        # an async run's sampler finished the next step's batch before this: training time
        rec.add_train_time(time.perf_counter() - mark["t"], cpu_seconds() - mark["cpu"])
        rec.evaluate(parts.sampler, parts.eval_tasks, step, final=final, swap=swap)
        return []

    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir, prefix=f"{label.replace('/', '-')}-") as out:
        with setup(config, out_dir=out, sink=NullSink()) as parts:
            rec.payload.setdefault("plans", {})[label] = parts.plan.describe()  # which backend generated, as resolved here
            print(f"{label} plan: {parts.plan.describe()}", flush=True)
            loop(parts, Hooks(before_step=before_step, after_step=after_step, evaluate=held_out))
            yield parts


def run_alone(args: argparse.Namespace, rec: Recorder) -> None:
    """Train each role's adapter with that agent alone (a one-agent `lora` run per role, `--steps`
    each, from the same seed, through the product's loop), then load both adapters into a `lora`
    team and evaluate it. The training time and tokens are the sum of the lone runs; only the
    assembled team is evaluated."""
    with base_sampler(arm_config("alone", args)) as (team_sampler, _, eval_tasks):
        for role in TEAM_ROLES[args.env]:
            with train(arm_config("alone", args, roles=(role,)), args, rec, label=f"alone/{role}", evaluate=False,
                       trained_alone=role) as parts:
                put_together(team_sampler.policies, parts.sampler.policies, role)
        rec.payload["steps"] = args.steps  # per agent; the curve holds both lone runs in turn
        rec.evaluate(team_sampler, eval_tasks, args.steps, final=True, swap=True)


def put_together(team: Any, lone: Any, role: str) -> None:
    """Copy the adapter `role`'s agent learned alone into the team's adapter of the same name
    (the agents are named after their roles in both)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    state = get_peft_model_state_dict(lone.for_agent(role).model, adapter_name=role)
    set_peft_model_state_dict(team.for_agent(role).model, state, adapter_name=role)


def run_trl(config: Any, sampler: Any, train_tasks: list[Any], args: argparse.Namespace, rec: Recorder, eval_tasks: list[Any]) -> None:
    """TRL trains its own copy of the model; at each evaluation its weights are copied into the
    Troupe policy that `evaluate` generates with, so both engines are judged by the same code.
    Training tokens are the completion tokens of TRL's reward calls."""
    from _trl import build_trainer
    from transformers import TrainerCallback

    from agents.envs._common import run_cached

    policy = sampler.policies.for_agent(config.topology.order()[0])

    class Track(TrainerCallback):
        mark = 0.0

        def on_train_begin(self, *a: Any, **k: Any) -> None:
            run_cached.cache_clear()
            self.mark = time.perf_counter()

        def on_step_end(self, _args: Any, state: Any, *a: Any, **k: Any) -> None:
            wall = time.perf_counter() - self.mark
            step, call = state.global_step, reward.calls[-1]
            rec.step(step, wall, {"reward/total": call["reward"], "generated_tokens": call.get("tokens", 0)}, {})
            print(f"trl step {step}: {wall:.1f}s reward {call['reward']:.3f}", flush=True)
            if step == args.steps or (args.eval_every and step % args.eval_every == 0):
                policy.model.load_state_dict(trainer.model.state_dict())
                rec.evaluate(sampler, eval_tasks, step, final=step == args.steps)
            run_cached.cache_clear()
            self.mark = time.perf_counter()

    trainer, reward, _ = build_trainer(config, sampler, train_tasks, out_dir=Path(args.work_dir) / "trl-learning", lora=False, callbacks=[Track()])
    trainer.train()
    reward.pool.shutdown()


# == report ========================================================================================


def mean_spread(values: list[float]) -> str:
    """`0.42 ± 0.05 (3)`: the mean over seeds ± their sample standard deviation, and how many seeds."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f} (1)"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({len(values)})"


def final_evals(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run's last greedy, sampled and roles-swapped (greedy) evaluations, by kind."""
    out: dict[str, dict[str, Any]] = {}
    for e in run["evals"]:
        out["swapped" if e.get("swapped") else "greedy" if e["temperature"] == 0.0 else "sampled"] = e
    return out


def at_tokens(run: dict[str, Any], budget: float, untrained: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The run's last greedy, unswapped evaluation taken with at most `budget` training tokens;
    when the run has none (its first evaluation came later), its untrained arm's (`untrained`,
    0 tokens: the same weights a trained run starts from), else None."""
    def greedy(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [e for e in r["evals"] if e["temperature"] == 0.0 and not e.get("swapped") and e.get("train_tokens", 0) <= budget]

    inside = greedy(run) or (greedy(untrained)[:1] if untrained else [])
    return inside[-1] if inside else None


def aggregate(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group of seeds: the seeds, steps, training minutes and tokens, and for each kind of
    final evaluation the team's and each agent's success per seed. A run that did not finish
    (no end record, or fewer steps than its group's longest) is named in `stopped`, not averaged."""
    groups: dict[str, dict[str, Any]] = {}
    longest: dict[str, int] = {}
    for name, run in runs.items():
        longest[group_of(name)] = max(longest.get(group_of(name), 0), run["steps"])
    for name, run in runs.items():
        g = groups.setdefault(group_of(name), {"seeds": [], "steps": [], "minutes": [], "tokens": [], "evals": {}, "runs": [], "names": [], "stopped": []})
        unfinished = "machine_start" in run and "machine_end" not in run  # killed: the JSON is the last one written
        if unfinished or run["steps"] < longest[group_of(name)]:  # stopped early: its last evaluation is of another step
            g["stopped"].append(f"seed {run['config'].get('seed', 0)} stopped at step {run['steps']}")
            continue
        g["seeds"].append(run["config"].get("seed", 0))
        g["steps"].append(run["steps"])
        g["minutes"].append(run["train_seconds"] / 60)
        g["tokens"].append(run.get("train_tokens", 0))
        g["runs"].append(run)
        g["names"].append(name)
        for kind, e in final_evals(run).items():
            k = g["evals"].setdefault(kind, {"team": [], "agents": {}})
            k["team"].append(e["team"])
            for agent, v in e["agents"].items():
                k["agents"].setdefault(agent, []).append(v)
    return groups


def report(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    found = {p.stem: json.loads(p.read_text()) for p in out_dir.glob("*.json") if base_arm(p.stem) in ARMS}
    runs = dict(sorted(found.items(), key=lambda kv: (ARMS.index(base_arm(kv[0])), kv[0])))
    if not runs:
        print(f"no arm results in {out_dir}; run --arm first", file=sys.stderr)
        return 1
    groups = aggregate(runs)
    trained = [g for name, g in groups.items() if not name.startswith("untrained") and "greedy" in g["evals"]]  # a run stopped before its first evaluation sets no budget
    budget = min((statistics.mean(g["tokens"]) for g in trained if g["tokens"]), default=0.0)
    rows = []
    for name, g in groups.items():
        ev = g["evals"]
        base = groups.get(untrained_of(name))
        greedy = ev.get("greedy", {}).get("team", [])
        delta = statistics.mean(greedy) - statistics.mean(base["evals"]["greedy"]["team"]) if greedy and base and "greedy" in base["evals"] else None
        equal = [e["team"] for run_name in g["names"]
                 for e in [at_tokens(runs[run_name], budget, untrained_run(runs, run_name))] if e is not None] if not name.startswith("untrained") else []
        rows.append([
            name, " ".join([str(sorted(g["seeds"])), *g["stopped"]]), max(g["steps"], default=0), f"{statistics.mean(g['minutes'] or [0]):.1f}", f"{statistics.mean(g['tokens'] or [0]):.0f}",
            mean_spread(greedy), f"{delta * 100:+.0f}" if delta is not None else "-",
            mean_spread(equal) if equal else "-",
            mean_spread(ev.get("sampled", {}).get("team", [])),
            mean_spread(ev.get("swapped", {}).get("team", [])),
            "; ".join(f"{a} {mean_spread(v)}" for a, v in ev.get("greedy", {}).get("agents", {}).items()) or "-",
            "; ".join(f"{a} {mean_spread(v)}" for a, v in ev.get("sampled", {}).get("agents", {}).items()) or "-",
        ])
    headers = ["arm", "seeds", "steps", "train min", "train tokens", "greedy team", "vs untrained (pts)",
               f"greedy team at <= {budget:.0f} tokens (last evaluation within)", "sampled team", "roles swapped (greedy)", "greedy per agent", "sampled per agent"]
    text = table(headers, rows) + "\n\n" + curve_table(runs) + "\n\n" + time_table(runs)
    print(text)
    print("\nmean ± sample std over seeds (number of seeds); per agent = the team's verdict on the episodes the agent acted in")
    png = out_dir / "learning.png"
    _plot(runs, groups, png)
    payload = {"command": command_line(), "table": text, "token_budget": budget,
               "arms": {a: {k: r.get(k) for k in ("steps", "train_seconds", "train_tokens", "evals", "machine_start", "machine_end")}
                        for a, r in runs.items()}}
    write_json(out_dir / "report.json", payload)
    print(f"\nwrote {png} and {out_dir / 'report.json'}")
    return 0


def time_table(runs: dict[str, dict[str, Any]]) -> str:
    """Each run's wall time, CPU time and the machine's load when it started and ended: on a shared
    machine the minutes measure the neighbours too; the CPU minutes (this process and its sandboxed
    programs, one torch thread) measure the work. A run with no end time did not finish."""
    def minutes(run: dict[str, Any], key: str) -> str:  # runs from before CPU time was recorded have none
        return f"{run[key] / 60:.1f}" if key in run else "-"

    rows = []
    for name, run in runs.items():
        start, end = run.get("machine_start") or {}, run.get("machine_end") or {}
        rows.append([name, f"{start.get('time', '-')[5:16]} - {end.get('time', '-')[11:16] if end else 'not finished'}",
                     run["steps"], minutes(run, "train_seconds"), minutes(run, "train_cpu_seconds"),
                     minutes(run, "eval_seconds"), minutes(run, "eval_cpu_seconds"),
                     f"{(start.get('loadavg') or ['-'])[0]} / {(end.get('loadavg') or ['-'])[0]}"])
    return table(["run", "start - end (UTC)", "steps", "train min", "train CPU min", "eval min", "eval CPU min",
                  "load average at start / end (1 min)"], rows)


def untrained_run(runs: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The untrained arm of a trained run, same seed if it ran, else seed 0's: its greedy
    evaluation is the same for every seed (same weights, same held-out tasks)."""
    group = group_of(name)
    return runs.get(untrained_of(group) + name[len(group):]) or runs.get(untrained_of(group))


def curve_table(runs: dict[str, dict[str, Any]]) -> str:
    """Each trained run's greedy held-out team success against its training tokens, from its
    untrained arm's (0 tokens) on: the table to read an arm at equal steps or equal tokens."""
    rows = []
    for name, run in runs.items():
        if name.startswith("untrained"):
            continue
        group = group_of(name)
        base = untrained_run(runs, name)
        points = [(0, 0, e["team"]) for e in (base or {}).get("evals", []) if e["temperature"] == 0.0 and not e.get("swapped")][:1]
        points += [(e["step"], e.get("train_tokens", 0), e["team"]) for e in run["evals"] if e["temperature"] == 0.0 and not e.get("swapped")]
        rows.append([group, run["config"].get("seed", 0), "; ".join(f"step {s} / {t} tok: {v:.2f}" for s, t, v in points) or "-"])
    return table(["arm", "seed", "greedy team success by step / generated training tokens"], rows)


def _plot(runs: dict[str, Any], groups: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.5))
    colors: dict[str, Any] = {}
    for name, run in runs.items():
        group = group_of(name)
        curve = run.get("curve") or []
        greedy = [e for e in run["evals"] if e["temperature"] == 0.0 and not e.get("swapped")]
        if name.startswith("untrained"):
            if greedy and name == group:
                ax2.axhline(greedy[0]["team"], linestyle=":", color="grey" if "single" in name or "self" in name else "black",
                            label=f"{group} (seed 0)")
            continue
        base = untrained_run(runs, name)
        start = [(0, e["team"]) for e in (base or {}).get("evals", []) if e["temperature"] == 0.0 and not e.get("swapped")][:1]
        points = start + [(e.get("train_tokens", 0), e["team"]) for e in greedy]
        first = group not in colors
        line = ax2.plot([p[0] for p in points], [p[1] for p in points], marker="o", alpha=0.8, color=colors.get(group),
                        label=group if first else None)[0]
        colors.setdefault(group, line.get_color())
        if curve:
            tokens = [c.get("train_tokens", 0) for c in curve]
            rewards = [c["reward"] for c in curve]
            smooth = [statistics.mean(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
            ax1.plot(tokens, smooth, color=colors[group], alpha=0.8, label=group if first else None)
    ax1.set(title="Training reward (5-step average), one line per seed", xlabel="generated training tokens", ylabel="reward")
    ax2.set(title="Held-out team success, greedy, one line per seed", xlabel="generated training tokens", ylabel="success", ylim=(0, 1))
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7, loc="best")
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the plot: the lines reach every corner
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def levels_arg(text: str) -> int | list[int]:
    """`2` -> 2; `2,3` -> [2, 3] (math_tool mixes the listed levels)."""
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a level (2) or levels separated by commas (2,3)") from None
    return levels[0] if len(levels) == 1 else levels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arm", choices=(*ARMS, "all"))
    parser.add_argument("--report", action="store_true", help="assemble the table and PNG from the JSON files")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--env", choices=tuple(TEAM_ROLES), default="math_tool")
    parser.add_argument("--level", type=levels_arg, default=2,
                        help="math_tool level, or levels to mix separated by commas (2,3: each task level 2 or 3 at random)")
    parser.add_argument("--size", type=int, default=None, help="plan_path grid side (default: 5 to 7 at random)")
    parser.add_argument("--single-role", default=None, help="the lone agent's role (default: tool for math_tool, plan for plan_path)")
    parser.add_argument("--steps", type=int, default=50, help="training steps N (the `alone` arm: N for each agent)")
    parser.add_argument("--eval-size", type=int, default=100, help="held-out tasks")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-seed", type=int, default=0, help="the held-out tasks are those a run with this seed holds out, for every --seed")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step")
    parser.add_argument("--k", type=int, default=4, help="group size")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=None, help="default: the arm's config (single/prompt 2e-5, lora 2e-4)")
    parser.add_argument("--max-turns", type=int, default=None,
                        help="team turns per episode (default 2, one each; 4 lets the tool retry once after the other agent "
                             "disagrees), and the `self` arms' turns; results go to ARM-Nturns.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every arm, as `python -m training run --set` takes it (e.g. generation.dtype=bfloat16)")
    parser.add_argument("--work-dir", default="/tmp/troupe-bench")
    parser.add_argument("--out-dir", default=None)
    args = parser.parse_args(argv)
    if not args.arm and not args.report:
        parser.error("give --arm ARM or --report")
    if args.arm == "trl" and args.env != "math_tool":
        parser.error("--arm trl: the TRL mirror is written for math_tool's rows only")
    if args.single_role and args.single_role not in TEAM_ROLES[args.env]:
        parser.error(f"--single-role: {args.env} roles are {', '.join(TEAM_ROLES[args.env])}")
    args.out_dir = args.out_dir or str(default_out_dir(args))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    every = [a for a in ARMS if a != "trl" or args.env == "math_tool"]
    for arm in every if args.arm == "all" else [args.arm] if args.arm else []:
        run_arm(arm, args)
    if args.report or args.arm == "all":
        return report(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
