"""Does a warm start help? Supervised fine-tuning before GRPO, measured on the bundled model.

    .venv/bin/python bench/warm_start.py --part calculator [--seeds 0,1] [--grpo-steps 4]
    .venv/bin/python bench/warm_start.py --part episodes [--source-steps 3]
    .venv/bin/python bench/warm_start.py --report

`calculator`: the calculator agent of `configs/arithmetic-calculator.yaml` on arithmetic level 4
(three-digit products: hard by hand, easy with the tool), which the untrained model almost never
solves, so GRPO's groups carry no signal. A set of worked calls is written for `--worked` training
tasks: the agent's own prompt (as a rollout renders it), a correct calculator call, the tool's real
result, and the answer line, as prompt-completion rows (`training.conversations`). An SFT run
(`algorithm: sft`) learns them. The base model and the warm-started model are measured on the same
held-out tasks: greedy success, and over `--samples` samples per task at the training temperature,
the share of candidates that write a call, that write only valid calls (parsed, a known tool, the
tool ran), and that succeed. Then GRPO runs `--grpo-steps` steps per seed from the base weights
(cold) and from the SFT checkpoint (warm, `model.init_from`), same settings and seeds, each
measured greedily on the same tasks (`--grpo-samples N` samples them too). `--reuse-base` takes
the base model's measurement from an earlier run's JSON on the same tasks (it is the slow part).

`episodes`: warm start from a run's own best episodes on a multi-agent task (expert iteration):
the two-agent `prompt` team of bench/learning.py on math_tool levels 2 and 3 with 4 turns (the
learning-evidence task and held-out tasks). A GRPO run of `--source-steps` steps stores its
episodes; the turns of those that succeeded become prompt-completion rows per agent
(`training.conversations.episode_rows`, what the run page's "Warm start from this run" builds);
an SFT run from the base weights learns them, and the SFT model is evaluated greedily on the
held-out tasks beside the source run's final weights.

Every result goes to one JSON file per part under --out-dir (default bench/results/warm_start/),
with the commands, CPU and wall time, and the machine's load; `--report` prints the tables.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, RESULTS, command_line, cpu_seconds, machine, table, write_json  # noqa: E402

CALCULATOR = REPO / "configs" / "arithmetic-calculator.yaml"
QUESTION = re.compile(r"What is (.+)\?")


# == measuring =====================================================================================


def measure(config: Any, checkpoint: str | None, tasks: list[Any], *, samples: int) -> dict[str, Any]:
    """Held-out success (greedy) and, over `samples` sampled candidates per task, the shares that
    call a tool, that call only validly, and that succeed; the same tasks for every model."""
    from agents.envs import load_environment
    from training.rollout import checkpoint_sampler, rollout_independent

    t0, c0 = time.perf_counter(), cpu_seconds()
    env = load_environment(config.topology.environment, **config.topology.env_args)
    with checkpoint_sampler(config, env, checkpoint or None, seed=12_345) as sampler:
        greedy = rollout_independent(sampler, tasks, k=1, temperature=0.0)
        sampled = rollout_independent(sampler, tasks, k=samples, temperature=config.generation.temperature) if samples else []
    out: dict[str, Any] = {"checkpoint": checkpoint, "tasks": len(tasks), "greedy_success": share([ep.success for ep in greedy])}
    for name, episodes in (("greedy", greedy), ("sampled", sampled)):
        cands = [t.candidates[0] for ep in episodes for t in ep.turns]
        out[name] = {
            "candidates": len(cands),
            "success": share([ep.success for ep in episodes]),
            "called": share([bool(c.generation.calls) for c in cands]),
            "valid_calls": share([bool(c.generation.calls) and not any(call.get("error") for call in c.generation.calls) for c in cands]),
            "errors": [call["error"][:80] for c in cands for call in c.generation.calls if call.get("error")][:5],
            "example": cands[0].generation.text[:300] if cands else "",
        }
    out["seconds"], out["cpu_seconds"] = time.perf_counter() - t0, cpu_seconds() - c0
    print(f"  measured {checkpoint or 'base'}: greedy success {out['greedy_success']:.3f}; sampled: called "
          f"{out['sampled'].get('called', 0):.3f} valid {out['sampled'].get('valid_calls', 0):.3f} "
          f"success {out['sampled'].get('success', 0):.3f} ({out['seconds']:.0f}s)", flush=True)
    return out


def share(flags: list[bool]) -> float:
    return sum(flags) / len(flags) if flags else 0.0


def train_run(config: Any, out: Path) -> dict[str, Any]:
    """A whole run through the engine's entry point (GRPO or SFT), its events under `out`."""
    from training.events import JsonlSink
    from training.runner import train

    t0, c0 = time.perf_counter(), cpu_seconds()
    shutil.rmtree(out, ignore_errors=True)  # a run of an earlier invocation: its events would be appended to
    result = train(config, out_dir=out, sink=JsonlSink(out))
    if result.status != "succeeded":
        raise SystemExit(f"{out}: the run {result.status}: {result.error}")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    seconds = time.perf_counter() - t0
    print(f"  trained {out.name}: {result.step} steps in {seconds:.0f}s, checkpoint {result.checkpoint}", flush=True)
    return {"checkpoint": result.checkpoint, "steps": result.step, "seconds": seconds, "cpu_seconds": cpu_seconds() - c0,
            "curve": curve_of(metrics)}


def curve_of(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = ("loss", "token_accuracy", "reward/total", "success", "generated_tokens")
    return [{"step": m["step"], **{k: m["values"][k] for k in keys if k in m["values"]}} for m in metrics]


def sft_config(config: Any, path: Path, args: argparse.Namespace) -> Any:
    """`config` turned into an SFT run on the conversations at `path` (GRPO's settings back to
    their defaults: an SFT run refuses them)."""
    return config.replace(**{"algorithm": "sft", "grpo": {}, "sft.path": str(path), "sft.batch_size": args.sft_batch,
                             "optim.steps": args.sft_steps, "optim.lr": args.sft_lr, "eval.every": 0, "checkpoint.every": 0})


# == calculator: worked calls, then GRPO warm against cold ========================================


def calculator_config(args: argparse.Namespace, seed: int) -> Any:
    from training.config import RunConfig

    return RunConfig.load(CALCULATOR).replace(**{
        "model.source": args.model, "seed": seed, "topology.env_args": {"level": 4}, "data.eval_size": args.eval_size, "eval.size": args.eval_size,
        "eval.every": 0, "checkpoint.every": 0, "optim.steps": args.grpo_steps, "optim.tasks_per_step": args.tasks, "grpo.k": args.k,
    })


def worked_calls(config: Any, rows: list[Any], path: Path) -> int:
    """One prompt-completion row per training task: the agent's prompt as a rollout renders it (the
    tool described, the worked exchange), a correct call, the calculator's real result, the answer."""
    import torch

    from agents.envs import load_environment
    from agents.tools import ToolCall, load_tool, result_text, run_call
    from training.policies import build_policies
    from training.rollout import Sampler, start_episodes

    env = load_environment(config.topology.environment, **config.topology.env_args)
    agent = config.topology.order()[0]
    sampler = Sampler(env, build_policies(config), config, torch.Generator().manual_seed(0))
    tool = load_tool("calculator")
    lines = []
    try:
        for task_id, row in rows:
            expression = QUESTION.fullmatch(row["question"]).group(1)  # type: ignore[union-attr]
            episode = start_episodes(sampler, [(task_id, row)])[0]
            prompt, _ = sampler.prompt(agent, episode.state)
            call = run_call(ToolCall("calculator", {"expression": expression}), {"calculator": tool})
            completion = [
                {"role": "assistant", "content": f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"},
                {"role": "tool", "name": "calculator", "content": result_text(call)},
                {"role": "assistant", "content": f"Answer: {result_text(call)}"},
            ]
            lines.append(json.dumps({"agent": agent, "prompt": prompt, "completion": completion}))
    finally:
        sampler.pool.shutdown()
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def part_calculator(args: argparse.Namespace) -> dict[str, Any]:
    from agents.envs import load_environment
    from training.data import load_tasks

    work = Path(args.work_dir) / "calculator"
    work.mkdir(parents=True, exist_ok=True)
    base = calculator_config(args, 0)
    train_tasks, held_out = load_tasks(base, load_environment(base.topology.environment, **base.topology.env_args))
    held_out = held_out[: args.eval_size]
    payload: dict[str, Any] = {"part": "calculator", "command": command_line(), "machine_start": machine(), "held_out": len(held_out)}
    out = Path(args.out_dir) / "calculator.json"

    print("worked calls", flush=True)
    worked = work / "worked-calls.jsonl"
    payload["worked_examples"] = worked_calls(base, train_tasks[: args.worked], worked)
    earlier = json.loads(out.read_text()) if out.is_file() else {}
    base_then = earlier.get("base") or {}
    same = base_then.get("tasks") == len(held_out) and base_then.get("sampled", {}).get("candidates") == len(held_out) * args.samples
    if args.reuse_base and same:  # the base model on the same tasks: measured by an earlier run
        print(f"base model: as measured at {earlier['machine_start']['time']} ({out.name})", flush=True)
        payload["base"] = earlier["base"]
    else:
        print("base model", flush=True)
        payload["base"] = measure(base, None, held_out, samples=args.samples)
    write_json(out, payload)
    print("SFT on the worked calls", flush=True)
    payload["sft"] = train_run(sft_config(base, worked, args), work / "sft")
    payload["warm"] = measure(base, payload["sft"]["checkpoint"], held_out, samples=args.samples)
    write_json(out, payload)
    payload["grpo"] = []
    for seed in args.seeds:
        for start in ("cold", "warm"):
            print(f"GRPO {start}, seed {seed}", flush=True)
            config = calculator_config(args, seed)
            if start == "warm":
                config = config.replace(**{"model.init_from.run": payload["sft"]["checkpoint"]})
            run = train_run(config, work / f"grpo-{start}-seed{seed}")
            run.update(start=start, seed=seed, result=measure(config, run["checkpoint"], held_out, samples=args.grpo_samples))
            payload["grpo"].append(run)
            write_json(out, payload)
    payload["machine_end"] = machine()
    write_json(out, payload)
    return payload


# == episodes: expert iteration on the team's own successes =======================================


def part_episodes(args: argparse.Namespace) -> dict[str, Any]:
    import learning

    from agents.envs import load_environment
    from training.conversations import episode_rows
    from training.data import load_tasks
    from training.warmstart import checkpoint_folder

    work = Path(args.work_dir) / "episodes"
    work.mkdir(parents=True, exist_ok=True)
    largs = learning.parse_args(["--arm", "prompt", "--model", args.model, "--level", "2,3", "--eval-size", str(args.eval_size), "--max-turns", "4",
                                 "--threads", str(args.threads), "--steps", str(args.source_steps), "--tasks", str(args.source_tasks)])
    config = learning.arm_config("prompt", largs).replace(**{"eval.every": 0, "checkpoint.every": 0})
    env = load_environment(config.topology.environment, **config.topology.env_args)
    _, held_out = load_tasks(config, env)  # the learning evidence's held-out tasks (`data.eval_seed`)
    payload: dict[str, Any] = {"part": "episodes", "command": command_line(), "machine_start": machine(), "held_out": len(held_out)}
    out = Path(args.out_dir) / "episodes.json"

    if args.source:  # a finished run's folder (its events and checkpoints), e.g. one this part trained before
        source = Path(args.source)
        print(f"source run: {source}", flush=True)
        metrics = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines()]
        payload["source"] = {"folder": str(source), "checkpoint": str(checkpoint_folder(source)), "steps": max(m["step"] for m in metrics),
                             "cpu_seconds": None, "curve": curve_of(metrics)}
    else:
        print(f"source run: GRPO, the prompt team, {args.source_steps} steps x {args.source_tasks} tasks", flush=True)
        source = work / "source"
        payload["source"] = train_run(config, source)
    stored = [json.loads(line) for line in (source / "rollouts.jsonl").read_text().splitlines()]
    best = [ep for ep in stored if ep.get("success")]
    turns = [episode_rows(ep) for ep in best]
    rows = {json.dumps(r, sort_keys=True): r for t in turns for r in t.rows}  # identical rows once, as the web does
    path = work / "best-episodes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows.values()), encoding="utf-8")
    per_agent: dict[str, int] = {}
    for r in rows.values():
        per_agent[r["agent"]] = per_agent.get(r["agent"], 0) + 1
    payload["episodes"] = {"stored": len(stored), "succeeded": len(best), "rows": len(rows), "per_agent": per_agent,
                           "truncated_left_out": sum(t.truncated for t in turns)}
    print(f"  {len(best)} of {len(stored)} stored episodes succeeded: {per_agent}", flush=True)
    write_json(out, payload)
    if not rows:
        raise SystemExit("no stored episode succeeded: nothing to warm start from (run more --source-steps)")

    if args.source_eval:
        payload["source"]["result"] = measure(config, payload["source"]["checkpoint"], held_out, samples=0)
        write_json(out, payload)
    print("SFT on the best episodes, from the base weights", flush=True)
    payload["sft"] = train_run(sft_config(config, path, args), work / "sft")
    payload["sft"]["result"] = measure(config, payload["sft"]["checkpoint"], held_out, samples=0)
    untrained = Path(args.learning_dir) / "untrained-multi-4turns.json"
    if untrained.is_file():  # the same weights on the same held-out tasks: evaluated by bench/learning.py
        greedy = [e for e in json.loads(untrained.read_text())["evals"] if e["temperature"] == 0.0 and not e.get("swapped")]
        payload["untrained"] = {"from": str(untrained.relative_to(REPO)), "greedy_success": greedy[0]["team"] if greedy else None}
    payload["machine_end"] = machine()
    write_json(out, payload)
    return payload


# == report ========================================================================================


def report(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    texts = []
    calc = out_dir / "calculator.json"
    if calc.is_file():
        p = json.loads(calc.read_text())
        rows = []
        for name, r in (("base model", p.get("base")), (f"SFT on {p.get('worked_examples')} worked calls", p.get("warm"))):
            if r:
                rows.append([name, *cells(r)])
        by_start: dict[str, list[dict[str, Any]]] = {}
        for run in p.get("grpo", []):
            by_start.setdefault(run["start"], []).append(run)
            rows.append([f"GRPO {run['steps']} steps from {'the SFT model' if run['start'] == 'warm' else 'the base'}, seed {run['seed']}",
                         *cells(run["result"])])
        for start, runs in by_start.items():
            rows.append([f"GRPO from {'the SFT model' if start == 'warm' else 'the base'}: mean ± std over seeds {[r['seed'] for r in runs]}",
                         spread([r["result"]["greedy_success"] for r in runs]),
                         spread([r["result"]["greedy"]["valid_calls"] for r in runs]),
                         *(spread([r["result"]["sampled"][k] for r in runs]) if runs[0]["result"]["sampled"].get("candidates") else "-"
                           for k in ("called", "valid_calls", "success")), "-"])
        texts.append(f"calculator, arithmetic level 4, {p['held_out']} held-out tasks\n" + table(
            ["model", "greedy success", "greedy: only valid calls", "sampled: calls a tool", "sampled: only valid calls", "sampled: success",
             "CPU min to measure"], rows))
    eps = out_dir / "episodes.json"
    if eps.is_file():
        p = json.loads(eps.read_text())
        rows = []
        if p.get("untrained"):
            rows.append(["untrained team (bench/learning.py, same tasks)", f"{p['untrained']['greedy_success']:.3f}", "-"])
        if "result" in p.get("source", {}):
            cpu = p["source"].get("cpu_seconds")
            rows.append([f"source run: GRPO {p['source']['steps']} steps", f"{p['source']['result']['greedy_success']:.3f}",
                         f"{cpu / 60:.1f}" if cpu else "-"])
        if "result" in p.get("sft", {}):
            e = p["episodes"]
            rows.append([f"SFT from the base on the source's {e['succeeded']} successful episodes ({e['rows']} rows: {e['per_agent']})",
                         f"{p['sft']['result']['greedy_success']:.3f}", f"{p['sft']['cpu_seconds'] / 60:.1f}"])
        texts.append(f"warm start from a run's best episodes: the prompt team, math_tool levels 2+3, 4 turns, {p['held_out']} held-out tasks\n"
                     + table(["model", "greedy team success", "train CPU min"], rows))
    if not texts:
        print(f"no results in {out_dir}; run --part first", file=sys.stderr)
        return 1
    print("\n\n".join(texts))
    return 0


def cells(r: dict[str, Any]) -> list[str]:
    """Greedy success and valid-call share, then the sampled shares ("-" where not sampled)."""
    s = r.get("sampled") or {}
    sampled = [f"{s[k]:.3f}" if s.get("candidates") else "-" for k in ("called", "valid_calls", "success")]
    return [f"{r['greedy_success']:.3f}", f"{r['greedy']['valid_calls']:.3f}", *sampled, f"{r['cpu_seconds'] / 60:.1f}"]


def spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.3f}" if values else "-"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("calculator", "episodes"))
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--out-dir", default=str(RESULTS / "warm_start"))
    parser.add_argument("--work-dir", default="/tmp/troupe-warm-start", help="run folders (checkpoints, events)")
    parser.add_argument("--learning-dir", default=str(RESULTS / "learning" / "math_tool-level2+3"),
                        help="bench/learning.py's results for the same task (the untrained team's evaluation)")
    parser.add_argument("--eval-size", type=int, default=32, help="held-out tasks")
    parser.add_argument("--samples", type=int, default=2, help="sampled candidates per held-out task (calculator)")
    parser.add_argument("--worked", type=int, default=64, help="worked calls: training tasks with a correct call written out")
    parser.add_argument("--grpo-samples", type=int, default=0, help="sampled candidates per held-out task after GRPO (0: greedy only)")
    parser.add_argument("--reuse-base", action="store_true", help="take the base model's measurement from an earlier run's JSON on the same tasks")
    parser.add_argument("--sft-steps", type=int, default=8)
    parser.add_argument("--sft-batch", type=int, default=8)
    parser.add_argument("--sft-lr", type=float, default=5e-5)
    parser.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1], help="GRPO seeds (calculator)")
    parser.add_argument("--grpo-steps", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=4, help="GRPO tasks per step (calculator)")
    parser.add_argument("--k", type=int, default=4, help="GRPO group size (calculator)")
    parser.add_argument("--source", help="warm start from this finished run's folder (metrics, rollouts, checkpoints) instead of training one (episodes)")
    parser.add_argument("--no-source-eval", dest="source_eval", action="store_false", help="do not evaluate the source run's weights (episodes)")
    parser.add_argument("--source-steps", type=int, default=3, help="the source run's GRPO steps (episodes)")
    parser.add_argument("--source-tasks", type=int, default=8, help="the source run's tasks per step (episodes)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    if not args.report and not args.part:
        parser.error("give --part calculator|episodes, or --report")
    return args


def main() -> int:
    args = parse_args()
    if args.report:
        return report(args)
    import torch

    torch.set_num_threads(args.threads)
    (part_calculator if args.part == "calculator" else part_episodes)(args)
    return report(args)


if __name__ == "__main__":
    raise SystemExit(main())
