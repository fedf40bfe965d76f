"""A team experiment's table, learning curves and what each role learned, built from the stored
results of its experiments (docs/benchmarks.md: "Referential game", and `plan_path` with a
function-calling tool). It trains and evaluates nothing: every number is read from what `python -m
training sweep` left in the experiments' folders.

    .venv/bin/python bench/team_report.py --together runs/referential-together \\
        --prompt runs/referential-prompt --apart runs/referential-apart --out bench/results/referential
    .venv/bin/python bench/team_report.py --together runs/plan-path-call --alone runs/plan-path-call-alone \\
        --out bench/results/plan-path-call

`--explore` is a further together experiment (`referential-together-explore`); `--alone` an
experiment of one agent acting alone (the planner with no tool); each flag repeats (one folder a
seed). An arm is named by what it trains; trials of the same name from any experiments are seeds of
one arm when their configs match apart from seed and name, and otherwise each is named with the
fields where they differ. `--keep` an earlier `report.json`: its trials join the table where their
experiment's folder is not among those given (results stored when that report was built). Each folder is
optional (a missing or unfinished one leaves its rows out or partial). Read from:
- each trial's `evaluations.jsonl` (greedy held-out success at every evaluated step, and sampled at
  the training temperature where the run set `eval.sampled`; step 0 is the untrained team) and
  `metrics.jsonl` (generated tokens per step, for the curves against tokens);
- each trial's `ablations.json` (`role_swap`, `apart`: `training.sweep.run_ablations`);
- each trial's `rollouts.jsonl`, over the last `--protocol-steps` training steps, as sampled in
  training at its temperature: in the referential game the protocol (the code word the speaker
  sent for each target, the candidate the listener picked for each code word); in `plan_path`
  each role's mean local reward and what it did (the tool: calls naming S's and G's cells; the
  planner: moves reaching G, moves copying the tool's answer);
- in `plan_path`, the same of each role on the held-out grids played greedily, at the first and the
  last evaluation, where the evaluations kept their episodes (`evaluations.jsonl`).

Writes `<out>/table.md` (also printed), `<out>/report.json`, `<out>/curves-steps.png` and
`<out>/curves-tokens.png`.
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.envs.plan_path import CALL, PlanPath, find, parse_moves, seen_grid  # noqa: E402
from agents.envs.referential import Referential, parse_choice, parse_code  # noqa: E402
from training.config import flat  # noqa: E402
from training.experiment import ExperimentSpec, Trial, mean_interval  # noqa: E402
from training.sweep import read_json  # noqa: E402
from training.trials import SAMPLED  # noqa: E402


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line still being written
    return rows


UNNAMED = ("seed", "name")
"""Config fields that never tell two arms apart: trials that differ only in them are seeds of one arm."""


def name_arms(trials: list[dict[str, Any]]) -> None:
    """Name each trial's arm: what it trains (`trains`, `arm_name`), and where trials that train
    the same differ in anything but their seed and name (another experiment's learning rate, its
    environment), the fields that differ (`together (lora), optim.lr=0.0001`). A trial kept from a
    report that stored no config keeps the arm it was given."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for t in trials:
        if "config" in t and "trains" in t:
            groups[t["trains"]].append(t)
    for trains, mine in groups.items():
        keys = sorted({k for t in mine for k in t["config"]})
        differ = [k for k in keys if len({json.dumps(t["config"].get(k), sort_keys=True, default=str) for t in mine}) > 1]
        for t in mine:
            t["arm"] = ", ".join([trains, *(f"{k}={_value(t['config'].get(k))}" for k in differ)])


def settings(trial: Trial, env: Any) -> dict[str, Any]:
    """The trial's config as dotted fields, less `UNNAMED`, with each environment argument it leaves
    out at the environment's default (`self_correct` unset is `self_correct: false`)."""
    fields = {k: v for k, v in flat(trial.config.to_dict()).items() if k not in UNNAMED}
    for name, param in inspect.signature(type(env).__init__).parameters.items():
        if param.default is not inspect.Parameter.empty:
            fields.setdefault(f"topology.env_args.{name}", param.default)
    return fields


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def arm_name(trial: Trial) -> str:
    """`together (lora)`, `speaker trained, listener frozen`, `planner alone, 2 turns (lora)`: what
    the trial's config trains."""
    config = trial.config
    agents = list(dict.fromkeys(config.topology.order()))
    trained = [a for a in agents if config.agent(a).trainable]
    spec = config.topology.specialization
    if len(agents) == 1:
        turns = f", {config.topology.max_turns} turns" if config.topology.env_args.get("self_correct") else ""
        return f"{agents[0]} alone{turns} ({spec})"
    if len(trained) == len(agents):
        return f"together ({spec})"
    frozen = [a for a in agents if a not in trained]
    return f"{', '.join(trained)} trained, {', '.join(frozen)} frozen ({spec})"


def curve(folder: Path, *, sampled: bool = False) -> list[tuple[int, float]]:
    """(step, held-out team success) of each evaluation in step order: greedy, or sampled at the
    training temperature (the runs that set `eval.sampled`)."""
    evals = [e for e in read_jsonl(folder / "evaluations.jsonl") if (e.get("temperature") != 0.0) == sampled and "ablation" not in e]
    return sorted({int(e["step"]): float(e["team"]["success"]) for e in evals}.items())


def tokens_by_step(folder: Path) -> dict[int, float]:
    """Generated tokens (all agents, all candidates) up to and including each step; 0 at step 0."""
    total, out = 0.0, {0: 0.0}
    for m in sorted(read_jsonl(folder / "metrics.jsonl"), key=lambda m: m.get("step", 0)):
        if "values" in m and "generated_tokens" in m["values"]:
            total += float(m["values"]["generated_tokens"])
            out[int(m["step"])] = total
    return out


def last_episodes(folder: Path, last_steps: int) -> tuple[list[dict[str, Any]], list[int]]:
    """The episodes of the last `last_steps` training steps in the trial's `rollouts.jsonl`, and
    those steps' [first, last]; no episodes when it has none."""
    episodes = read_jsonl(folder / "rollouts.jsonl")
    if not episodes:
        return [], []
    final = max(int(e["step"]) for e in episodes)
    return [e for e in episodes if int(e["step"]) > final - last_steps], [max(final - last_steps + 1, 1), final]


def protocol(folder: Path, codes: tuple[str, ...], k: int, last_steps: int) -> dict[str, Any]:
    """From the last `last_steps` training steps' rollouts: per target, the speaker's code words
    (the most frequent first, with its share); per code word, the candidates the listener picked."""
    episodes, steps = last_episodes(folder, last_steps)
    if not episodes:
        return {}
    speaker: dict[str, Counter[str]] = defaultdict(Counter)
    listener: dict[str, Counter[str]] = defaultdict(Counter)
    for ep in episodes:
        target = str(ep.get("question", "")).removeprefix("target: ")
        code = None
        for turn in ep["turns"]:
            text = turn["candidates"][turn["chosen"]]["text"]
            if turn["role"] == "speaker":
                code = parse_code(text, codes)
                speaker[target][code or "-"] += 1
            elif turn["role"] == "listener":
                shown = re.findall(r"(?:^|, |: )([A-I])\. ([A-Za-z]+)", turn["prompt"], flags=re.MULTILINE)
                names = [name for _, name in shown][:k]
                choice = parse_choice(text, k, names) if len(names) == k else None
                listener[code or "-"][names[choice] if choice is not None else "-"] += 1

    def top(counts: dict[str, Counter[str]]) -> dict[str, list[Any]]:
        return {key: [c.most_common(1)[0][0], round(c.most_common(1)[0][1] / sum(c.values()), 2), sum(c.values())]
                for key, c in sorted(counts.items())}

    return {"steps": steps, "speaker": top(speaker), "listener": top(listener)}


def roles_at_work(folder: Path, last_steps: int) -> dict[str, Any]:
    """`plan_path`, from the last `last_steps` training steps' rollouts: per role, its mean local
    reward and what it did (the tool: calls parsed, calls naming S's and G's cells; the planner:
    moves reaching G, moves that copy the tool's answer)."""
    episodes, steps = last_episodes(folder, last_steps)
    return {"steps": steps, "roles": roles_in(episodes)} if episodes else {}


def roles_held_out(folder: Path) -> dict[str, Any]:
    """`plan_path`, on the held-out tasks played greedily: what each role did at the first and the
    last evaluation (`roles_in`), where the run's evaluations kept their episodes."""
    greedy = [e for e in read_jsonl(folder / "evaluations.jsonl") if e.get("temperature") == 0.0 and e.get("episodes")]
    if not greedy:
        return {}
    first, last = min(greedy, key=lambda e: e["step"]), max(greedy, key=lambda e: e["step"])
    return {"steps": [first["step"], last["step"]], "first": roles_in(first["episodes"]), "last": roles_in(last["episodes"])}


def roles_in(episodes: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per role over `episodes` (each turn's chosen candidate): its mean local reward and the share of
    its actions that did each thing `roles_at_work` counts."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    local: dict[str, list[float]] = defaultdict(list)
    for ep in episodes:
        answer = None
        for turn in ep["turns"]:
            chosen = turn["candidates"][turn["chosen"]]
            role, c = turn["role"], counts[turn["role"]]
            local[role].append(float(chosen["local"]))
            c["actions"] += 1
            if role == "tool":
                grid = seen_grid(turn["prompt"])
                call = CALL.search(chosen["text"])
                c["parsed"] += call is not None
                c["right"] += call is not None and [int(x) for x in call.groups()] == [*find(grid, "S"), *find(grid, "G")]
                answer = parse_moves(chosen.get("tool_output") or "")
            else:
                moves = parse_moves(chosen["text"])
                c["reached"] += chosen["local"] == 1.0
                c["copied"] += answer is not None and moves == answer
    return {role: {"local": round(sum(v) / len(v), 3), **{k: round(n / counts[role]["actions"], 3)
                                                           for k, n in counts[role].items() if k != "actions"}}
            for role, v in sorted(local.items())}


def show_roles(roles: dict[str, dict[str, float]]) -> str:
    return "; ".join(f"{role}: local {r['local']:+.2f}" + "".join(f", {k} {v:.0%}" for k, v in r.items() if k != "local")
                     for role, r in roles.items())


def show_held_out(h: dict[str, Any]) -> str:
    if not h:
        return "-"
    return f"step {h['steps'][0]}: {show_roles(h['first'])}; step {h['steps'][1]}: {show_roles(h['last'])}"


def show_protocol(p: dict[str, Any]) -> str:
    if not p:
        return "-"
    if "roles" in p:
        return f"{show_roles(p['roles'])} (steps {p['steps'][0]}-{p['steps'][1]})"
    said = ", ".join(f"{t}→{c} ({share:.0%})" for t, (c, share, _) in p["speaker"].items())
    heard = ", ".join(f"{c}→{t} ({share:.0%})" for c, (t, share, _) in p["listener"].items())
    return f"speaker {said}; listener {heard} (steps {p['steps'][0]}-{p['steps'][1]})"


def stat(values: list[float]) -> dict[str, Any]:
    interval = mean_interval(values)
    if interval is None:
        return {"n": 0}
    return {"n": interval.n, "mean": interval.mean, "ci95": interval.half_width, "min": min(values), "max": max(values),
            "values": [round(v, 4) for v in values]}


def show(s: dict[str, Any]) -> str:
    if not s.get("n"):
        return "-"
    ci = f" ± {s['ci95']:.3f}" if s.get("ci95") is not None else ""
    return f"{s['mean']:.3f}{ci} (min {s['min']:.3f}, max {s['max']:.3f})"


def collect(folder: Path, last_steps: int) -> list[dict[str, Any]]:
    """One record per trial of the experiment in `folder`: its arm, seed, status, curve, tokens,
    last greedy success, ablations and protocol."""
    spec = ExperimentSpec.load(folder / "experiment.yaml")
    environment = spec.base.topology.environment
    if environment not in ("referential", "plan_path"):
        raise SystemExit(f"error: {folder} is an experiment on {environment}; this report reads referential and plan_path")
    env = Referential(**spec.base.topology.env_args) if environment == "referential" else PlanPath(**spec.base.topology.env_args)
    out = []
    for trial in spec.trials():
        tf = folder / f"trial-{trial.index:03d}"
        record = read_json(tf / "trial.json")
        greedy, sampled = curve(tf), curve(tf, sampled=True)
        tokens = tokens_by_step(tf)
        done = record.get("status") == "succeeded"
        out.append({
            "experiment": spec.name, "trial": tf.name, "seed": trial.seed,
            "arm": arm_name(trial), "trains": arm_name(trial),
            "config": settings(trial, env),
            "status": record.get("status", "running" if greedy else "not started"),
            "curve": greedy, "tokens": [[s, tokens.get(s)] for s, _ in greedy], "sampled_curve": sampled,
            "final": greedy[-1][1] if done and greedy else None,
            "final_sampled": sampled[-1][1] if done and sampled else None,
            "untrained": greedy[0][1] if greedy and greedy[0][0] == 0 else None,
            "untrained_sampled": sampled[0][1] if sampled and sampled[0][0] == 0 else None,
            "ablations": {k: v for k, v in read_json(tf / "ablations.json").items()},
            "protocol": (protocol(tf, env.codes, env.k, last_steps) if isinstance(env, Referential)
                         else roles_at_work(tf, last_steps)),
            "held_out_roles": {} if isinstance(env, Referential) else roles_held_out(tf),
            "seconds": record.get("seconds"), "chance": env.chance if isinstance(env, Referential) else None,
            "agents": len(dict.fromkeys(trial.config.topology.order())),
        })
    return out


def build(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows: untrained, each arm, and each arm's ablations, over seeds; each row greedy
    (its top-level numbers) and, where the runs evaluated so, `sampled` at the training temperature."""
    rows = []
    # step 0 of every `lora` team trial is the same warm start, evaluated with the trial's seed: one value per seed
    lora = [t for t in trials if t.get("trains", t["arm"]).endswith("(lora)") and t.get("agents", 2) > 1]
    untrained = {t["seed"]: t["untrained"] for t in reversed(lora) if t["untrained"] is not None}
    untrained_sampled = {t["seed"]: t["untrained_sampled"] for t in reversed(lora) if t.get("untrained_sampled") is not None}
    if untrained:
        rows.append({"row": "untrained team (step 0)", **stat([untrained[s] for s in sorted(untrained)]), "seeds": sorted(untrained),
                     "sampled": stat([untrained_sampled[s] for s in sorted(untrained_sampled)])})
    for arm in dict.fromkeys(t["arm"] for t in trials):
        mine = [t for t in trials if t["arm"] == arm]
        if mine[0].get("agents", 2) == 1:  # an agent alone starts from its own untrained point
            start = [t for t in mine if t["untrained"] is not None]
            rows.append({"row": f"{arm}: untrained (step 0)", **stat([t["untrained"] for t in start]), "seeds": [t["seed"] for t in start],
                         "sampled": stat([t["untrained_sampled"] for t in start if t.get("untrained_sampled") is not None])})
        done = [t for t in mine if t["final"] is not None]
        rows.append({"row": arm, **stat([t["final"] for t in done]), "seeds": [t["seed"] for t in done],
                     "sampled": stat([t["final_sampled"] for t in done if t.get("final_sampled") is not None]),
                     "status": {t["seed"]: t["status"] for t in mine}})
        for key, label in (("role_swap", "roles swapped"), ("apart", "trained apart, then teamed")):
            stored = [(t["seed"], t["ablations"][key]["metrics"]) for t in mine if "metrics" in t["ablations"].get(key, {})]
            if stored:
                sampled = [m[SAMPLED + "team.success"] for _, m in stored if SAMPLED + "team.success" in m]
                rows.append({"row": f"{arm}: {label}" if key != "apart" else label, **stat([m["team.success"] for _, m in stored]),
                             "seeds": sorted(seed for seed, _ in stored), "sampled": stat(sampled), "dedupe": key == "apart"})
    merged: list[dict[str, Any]] = []
    for r in rows:  # `apart` is reported from both halves of a seed: one row
        if r.get("dedupe") and any(m["row"] == r["row"] for m in merged):
            continue
        merged.append(r)
    return merged


def plot(trials: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(t["arm"] for t in trials if t["curve"]))
    paths = []
    for x_key, xlabel, name in (("steps", "training step", "curves-steps.png"), ("tokens", "generated tokens (all agents)", "curves-tokens.png")):
        fig, axes = plt.subplots(1, max(len(arms), 1), figsize=(4.2 * max(len(arms), 1), 3.4), squeeze=False, sharey=True)
        for ax, arm in zip(axes[0], arms):
            for t in (t for t in trials if t["arm"] == arm and t["curve"]):
                at, color = dict(t["tokens"]), None
                for points, style, how in ((t["curve"], "-", ""), (t.get("sampled_curve", []), "--", ", sampled")):
                    pairs = [(s if x_key == "steps" else at.get(s), y) for s, y in points]
                    pairs = [(x, y) for x, y in pairs if x is not None]
                    if pairs:
                        line = ax.plot([x for x, _ in pairs], [y for _, y in pairs], style, marker="o", label=f"seed {t['seed']}{how}",
                                       color=color)
                        color = line[0].get_color()
            if trials[0]["chance"] is not None:
                ax.axhline(trials[0]["chance"], color="grey", linestyle=":", label="chance")
            ax.set_title(arm, fontsize=9)
            ax.set_xlabel(xlabel)
            if trials[0]["chance"] is not None:
                ax.set_ylim(0, 1)
            else:  # plan_path: no chance level; scaled to the arms' own numbers, shared by the panels
                ax.set_ylim(0, max([0.2, *(1.25 * y for t in trials for _, y in t["curve"] + t.get("sampled_curve", []))]))
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel("held-out success (dashed: sampled)")
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("together", "prompt", "apart", "explore", "alone"):
        parser.add_argument(f"--{name}", type=Path, action="append", default=[],
                            help=f"the {name} experiment's sweep folder (repeat for several, e.g. one a seed)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/referential"))
    parser.add_argument("--keep", type=Path, help="an earlier report.json whose trials join the table where their experiment's "
                        "folder is not given (its stored results, read when that report was built)")
    parser.add_argument("--protocol-steps", type=int, default=10, help="training steps the protocol is read from (the last ones)")
    args = parser.parse_args(argv)
    folders = [*args.together, *args.prompt, *args.apart, *args.explore, *args.alone]
    missing = [str(f) for f in folders if not (f / "experiment.yaml").is_file()]
    if not folders or missing:
        print(f"error: no experiment folder (experiment.yaml) at {', '.join(missing) or 'any of --together/--prompt/--apart'}", file=sys.stderr)
        return 2
    trials = [t for f in folders for t in collect(f, args.protocol_steps)]
    if args.keep is not None:
        read = {t["experiment"] for t in trials}
        kept = read_json(args.keep).get("trials", [])
        if not kept:
            print(f"error: {args.keep} is not a report.json with trials", file=sys.stderr)
            return 2
        trials = [t for t in kept if t["experiment"] not in read] + trials
    name_arms(trials)
    rows = build(trials)
    args.out.mkdir(parents=True, exist_ok=True)
    chance = trials[0]["chance"]  # None in plan_path: the untrained team is its baseline
    lines = ["| arm | greedy team success, mean ± 95% t-interval (min, max) | seeds | per seed | sampled (T=1), mean | per seed |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        sampled = r.get("sampled", {})
        lines.append(f"| {r['row']} | {show(r)} | {r.get('n', 0)} | {' '.join(f'{v:.3f}' for v in r.get('values', []))} "
                     f"| {show(sampled)} | {' '.join(f'{v:.3f}' for v in sampled.get('values', []))} |")
    if chance is not None:
        lines.append(f"\nchance {chance:.3f}; target: together ≥ 0.8 (or ≥ chance + 0.5), apart and swapped ≤ chance + 0.1")
    what = "protocol" if chance is not None else "each role at work"
    held = any(t.get("held_out_roles") for t in trials)  # the runs' evaluations kept their episodes
    lines.append(f"\n| trial | arm | seed | status | minutes | {what} |" + (" held out, greedy |" if held else "")
                 + "\n|---|---|---|---|---|---|" + ("---|" if held else ""))
    for t in trials:
        minutes = f"{t['seconds'] / 60:.0f}" if t["seconds"] else "-"
        lines.append(f"| {t['experiment']}/{t['trial']} | {t['arm']} | {t['seed']} | {t['status']} | {minutes} | {show_protocol(t['protocol'])} |"
                     + (f" {show_held_out(t.get('held_out_roles', {}))} |" if held else ""))
    table = "\n".join(lines)
    (args.out / "table.md").write_text(table + "\n", encoding="utf-8")
    (args.out / "report.json").write_text(json.dumps({"rows": rows, "trials": trials}, indent=1, default=str), encoding="utf-8")
    paths = plot(trials, args.out)
    print(table)
    print("\nwrote " + ", ".join(str(p) for p in [args.out / "table.md", args.out / "report.json", *paths]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
