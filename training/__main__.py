"""Command line: `python -m training run CONFIG.yaml [--set key=value ...] [--out DIR]`,
`python -m training eval CONFIG.yaml [--checkpoint DIR]`, `python -m training check CONFIG.yaml`,
`python -m training sweep EXPERIMENT.yaml [--out DIR]` (the trials of an experiment, in turn)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from training.config import ConfigError, RunConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description="Troupe's multi-agent GRPO engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("run", "train a run"), ("eval", "evaluate base models or a checkpoint"), ("check", "validate a config and print it resolved")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("config", help="YAML run config")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a field, e.g. optim.lr=1e-4")
        if name == "run":
            p.add_argument("--out", help="output folder (default runs/<name>-<time>)")
        if name == "eval":
            p.add_argument("--checkpoint", help="checkpoint folder (default: the untrained base models)")
            p.add_argument("--sampled", action="store_true", help="also evaluate sampled at the training temperature")
    p = sub.add_parser("sweep", help="run an experiment's trials in turn and compare its arms")
    p.add_argument("config", help="YAML experiment: base, axes, seeds (see training.experiment)")
    p.add_argument("--out", help="output folder (default runs/<experiment name>); trials already finished there are kept")
    args = parser.parse_args(argv)
    if args.command == "sweep":
        from training.sweep import sweep_main

        return sweep_main(args.config, out=args.out)

    try:
        config = RunConfig.load(args.config, args.overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
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

    from training.events import JsonlSink, MultiSink, ProgressSink

    if args.command == "eval":
        from training.trainer import evaluate_checkpoint

        if args.sampled:
            config = config.replace(**{"eval.sampled": True})
        results = evaluate_checkpoint(config, args.checkpoint, sink=ProgressSink())
        for r in results:
            r.pop("examples", None)
            print(json.dumps(r))
        return 0

    from training.trainer import train

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


if __name__ == "__main__":
    sys.exit(main())
