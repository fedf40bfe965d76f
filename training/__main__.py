"""Command line: `python -m training run CONFIG.yaml [--set key=value ...] [--out DIR]`,
`python -m training eval CONFIG.yaml [--checkpoint DIR]`, `python -m training check CONFIG.yaml`,
`python -m training export CONFIG.yaml --checkpoint DIR --agent NAME --out DIR [--dtype bfloat16|trained]
[--gguf f16|q8_0]` (merge a LoRA adapter into its base; with --gguf, as one GGUF file and an Ollama Modelfile), `python -m training playground CONFIG.yaml --task JSON
[--checkpoint DIR [--with-base]]` (play one task turn by turn, one JSON line per turn), and
`python -m training sweep EXPERIMENT.yaml [--out DIR]` (the trials of an experiment, in turn) and
`python -m training ablate RUN_DIR --kind role_swap|untrained|alone|apart [--agent NAME] [--partner DIR] [--sampled]`
(a finished team run evaluated with its roles swapped, untrained, one agent alone, or teamed with the
agents a partner run trained while this one froze them: `training.ablation`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from training.config import ConfigError, RunConfig

COMMANDS = (
    ("run", "train a run"),
    ("eval", "evaluate base models or a checkpoint"),
    ("check", "validate a config and print it resolved"),
    ("export", "merge an agent's LoRA adapter from a checkpoint into its base model"),
    ("playground", "play one task turn by turn with the base models or a checkpoint"),
)


def _seed_list(text: str) -> list[int]:
    """`--seeds 0,2`: the seeds as integers (argparse names the option in its error)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are integers separated by commas, like 0,2, not {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training", description="Troupe's multi-agent GRPO engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("config", help="YAML run config")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. optim.lr=1e-4")
        if name == "run":
            p.add_argument("--out", help="output folder (default runs/<name>-<time>)")
        if name == "eval":
            p.add_argument("--checkpoint", help="checkpoint folder (default: the untrained base models)")
            p.add_argument("--sampled", action="store_true", help="also evaluate sampled at the training temperature")
        if name == "export":
            p.add_argument("--checkpoint", required=True, help="checkpoint folder holding the agent's adapter")
            p.add_argument("--agent", required=True, help="the agent whose adapter is merged")
            p.add_argument("--out", required=True, help="folder for the merged model (replaced if it exists)")
            p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "trained"),
                           help="save in bfloat16 (default) or in the dtype the run trained in")
            p.add_argument("--gguf", choices=("f16", "q8_0"),
                           help="write one GGUF file of this type (llama.cpp, Ollama) and a Modelfile instead of safetensors")
        if name == "playground":
            p.add_argument("--task", required=True, help='the task as a JSON object of its row fields, e.g. \'{"question": "Compute 2+3.", "answer": "5"}\'')
            p.add_argument("--checkpoint", help="checkpoint folder (default: the base models)")
            p.add_argument("--with-base", action="store_true", help="with --checkpoint, also play with the base models side by side")
            p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
            p.add_argument("--max-new-tokens", type=int, help="completion length cap per turn (default: the config's)")
    p = sub.add_parser("sweep", help="run an experiment's trials in turn and compare its arms")
    p.add_argument("config", help="YAML experiment: base, axes, seeds (see training.experiment)")
    p.add_argument("--out", help="output folder (default runs/<experiment name>); trials already finished there are kept")
    p.add_argument("--seeds", type=_seed_list, metavar="0,1",
                   help="train only these seeds' trials and evaluate their ablations (the others are left for a later sweep)")
    p = sub.add_parser("ablate", help="evaluate a finished team run with its roles swapped, untrained, or one agent alone")
    p.add_argument("run_dir", help="the run's output folder (its config.yaml and newest checkpoint), or a checkpoint folder")
    p.add_argument("--kind", required=True, choices=("role_swap", "untrained", "alone", "apart"), help="which ablation")
    p.add_argument("--partner", help="with --kind apart: the run that trained the agents this run froze (its folder or a checkpoint)")
    p.add_argument("--agent", action="append", default=[], help="with --kind alone: the agent acting alone (repeat for several; default: every agent that may)")
    p.add_argument("--sampled", action="store_true", help="also evaluate sampled at the training temperature (greedy always)")
    p.add_argument("--checkpoint", help="a checkpoint folder other than the run's newest")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sweep":
        from training.sweep import sweep_main

        return sweep_main(args.config, out=args.out, seeds=args.seeds)
    if args.command == "ablate":
        return _ablate(args)

    try:
        config = RunConfig.load(args.config, args.overrides)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"config error: {problem}", file=sys.stderr)
        return 2
    except FileNotFoundError:
        print(f"config error: no such file {args.config}", file=sys.stderr)
        return 2

    from agents.plugins import PluginError, register_named_in

    try:  # the command line is the operator's own: the plugins its config names may load
        register_named_in(config.topology.environment, [path for path, _ in config.data.reward_functions()],
                          [t for a in config.topology.agents for t in a.tools])
    except PluginError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2

    if args.command == "check":
        print(config.to_yaml(), end="")
        return 0

    if args.command == "export":
        return _export(config, args)
    if args.command == "playground":
        return _playground(config, args)

    from training.events import JsonlSink, MultiSink, ProgressSink

    if args.command == "eval":
        from training.evaluation import evaluate_checkpoint
        from training.events import summary

        if args.sampled:
            config = config.replace(**{"eval.sampled": True})
        results = evaluate_checkpoint(config, args.checkpoint, sink=ProgressSink())
        for r in results:
            print(json.dumps(summary(r)))
        return 0

    from training.runner import train

    out = Path(args.out or f"runs/{config.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if (out / "metrics.jsonl").exists() and not config.checkpoint.resume_from:
        print(f"error: {out} already holds a run's metrics; pick a new --out (or resume with --set checkpoint.resume_from=...)", file=sys.stderr)
        return 2
    sink = MultiSink(JsonlSink(out), ProgressSink())
    t0 = time.perf_counter()
    try:
        result = train(config, out_dir=out, sink=sink)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - t0
    ran = result.step - result.start_step
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"{result.status}: {ran} steps{resumed} in {elapsed:.0f}s ({elapsed / max(ran, 1):.1f}s/step); output in {out}")
    if result.checkpoint:
        print(f"checkpoint: {result.checkpoint}")
    evals = result.evaluations
    if len(evals) == 1:
        only = evals[0]
        print(f"held-out team success at step {only['step']}: {only['team']['success']:.3f}")
        for agent, values in only["agents"].items():
            print(f"  {agent}: {values['success']:.3f}")
    elif evals:
        first, last = evals[0], evals[-1]
        print(f"held-out team success: step {first['step']} {first['team']['success']:.3f} -> step {last['step']} {last['team']['success']:.3f}")
        for agent in last["agents"]:
            print(f"  {agent}: {first['agents'][agent]['success']:.3f} -> {last['agents'][agent]['success']:.3f}")
    return 0


def _export(config: RunConfig, args: argparse.Namespace) -> int:
    from training.export import export_gguf, merge_adapter

    adapter = Path(args.checkpoint) / args.agent
    try:
        if args.gguf:
            gguf = export_gguf(config, agent=args.agent, adapter=adapter, out=args.out, gguf_type=args.gguf)
        else:
            export = merge_adapter(config, agent=args.agent, adapter=adapter, out=args.out, dtype=args.dtype)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.gguf:
        print(f"merged {args.agent} ({gguf.architecture}) into {gguf.file} ({gguf.gguf_type}): {', '.join(gguf.files)}")
    else:
        print(f"merged {args.agent} ({export.dtype}) into {export.folder}: {', '.join(export.files)}")
    return 0


def _ablate(args: argparse.Namespace) -> int:
    from agents.envs import load_environment
    from agents.plugins import PluginError, register_named_in
    from training.ablation import Ablation, AblationError, ablations_for, evaluate_ablation, run_folder
    from training.events import summary

    try:
        config, checkpoint = run_folder(args.run_dir, checkpoint=args.checkpoint)
        register_named_in(config.topology.environment, [path for path, _ in config.data.reward_functions()],
                          [t for a in config.topology.agents for t in a.tools])
    except (ConfigError, FileNotFoundError, PluginError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.kind == "alone":
        env = load_environment(config.topology.environment, **config.topology.env_args)
        chosen = [Ablation("alone", a) for a in args.agent] or [a for a in ablations_for(config, env) if a.kind == "alone"]
        if not chosen:
            print(f"error: {env.name}: no agent of this run can act alone", file=sys.stderr)
            return 2
    else:
        if args.agent:
            print("error: --agent goes with --kind alone", file=sys.stderr)
            return 2
        chosen = [Ablation(args.kind)]
    if (args.kind == "apart") != bool(args.partner):
        print("error: --kind apart needs --partner DIR" if args.kind == "apart" else "error: --partner goes with --kind apart", file=sys.stderr)
        return 2
    print(f"run {args.run_dir}: {'checkpoint ' + str(checkpoint) if checkpoint else 'no checkpoint'}; held-out tasks of seed {config.seed}")
    for ablation in chosen:
        try:
            results = evaluate_ablation(config, checkpoint, ablation, partner=args.partner, sampled=args.sampled or None)
        except (AblationError, ConfigError, FileNotFoundError) as exc:
            print(f"error: {ablation.label}: {exc}", file=sys.stderr)
            return 2
        for r in results:
            agents = " ".join(f"{a} {v['success']:.3f}" for a, v in r["agents"].items())
            how = "greedy" if not r.get("temperature") else f"sampled at {r['temperature']:g}"
            print(f"{ablation.label} (step {r['step']}, {r['n']} tasks, {how}): team {r['team']['success']:.3f}  {agents}")
            print(json.dumps(summary(r)))
    return 0


def _playground(config: RunConfig, args: argparse.Namespace) -> int:
    from training.playground import lane, play, untrained_label

    try:
        row = json.loads(args.task)
    except json.JSONDecodeError as exc:
        print(f"error: --task is not JSON: {exc}", file=sys.stderr)
        return 2
    if not isinstance(row, dict):
        print("error: --task must be a JSON object of the task's fields", file=sys.stderr)
        return 2
    if args.with_base and not args.checkpoint:
        print("error: --with-base compares a checkpoint with the base models: give --checkpoint too", file=sys.stderr)
        return 2
    lanes = [lane(f"checkpoint {args.checkpoint}", trained=True)] if args.checkpoint else []
    if not args.checkpoint or args.with_base:
        lanes.append(lane(untrained_label(config), trained=False))
    printed = {id(each): 0 for each in lanes}

    def show(lanes: list[dict]) -> None:  # each new turn, as a JSON line, as soon as it is played
        for each in lanes:
            for turn in each["turns"][printed[id(each)]:]:
                print(json.dumps({"lane": each["label"], **turn}), flush=True)
            printed[id(each)] = len(each["turns"])

    try:
        play(config, row, lanes=lanes, checkpoint=args.checkpoint, temperature=args.temperature,
             max_new_tokens=args.max_new_tokens, on_turn=show)
    except (ValueError, FileNotFoundError) as exc:  # a ConfigError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for each in lanes:
        print(json.dumps({"lane": each["label"], "done": each["done"], "success": each["success"], "turns": len(each["turns"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
