"""Peak resident memory of a two-agent run under `prompt`, `lora` and `full`.

    .venv/bin/python bench/memory.py [--steps 2] [--specs prompt,lora,full] [--out bench/results/memory.json]

Each specialization runs in a fresh Python process (so one's peak never hides another's): it
builds the policies for the two-agent math_tool topology (tool -> reasoner, configs/math-*.yaml)
with the bundled SmolLM2-135M-Instruct, then runs `--steps` training steps (tree sampling, then
the update with AdamW) through the product's loop (`training.trainer.setup` + `loop`, which also
saves the run's final checkpoint). Reported per process: resident memory after the imports, after the
models and optimizers are built (safetensors are memory-mapped, so weights count once touched),
and the peak (`ru_maxrss`, the kernel's high-water mark of the
process itself; sandbox children are not counted). "x prompt" divides peaks by `prompt`'s.

What to expect: `prompt` trains one full model (weights + gradients + two AdamW moments, about
4x the weights); `lora` keeps one frozen base and two small adapters, so it sits *below* `prompt`;
`full` holds two models with their optimizers, about twice `prompt`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, machine, table, write_json  # noqa: E402

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def rss_mib() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss / 2**20)


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Runs inside the fresh process: build, step, report."""
    import torch

    from training.config import RunConfig
    from training.events import NullSink
    from training.trainer import Hooks, loop, setup

    if args.threads:
        torch.set_num_threads(args.threads)
    after_imports = rss_mib()
    config = RunConfig.load(CONFIGS / f"math-{args.child}.yaml").replace(
        **{
            "model.source": args.model,
            "topology.env_args": {"level": 1},
            "optim.tasks_per_step": args.tasks,
            "optim.steps": args.steps,
            "grpo.k": args.k,
            "generation.max_new_tokens": args.max_new_tokens,
            "eval.every": 0,
            "checkpoint.every": 0,
        }
    )
    tokens: list[float] = []
    with tempfile.TemporaryDirectory(prefix="troupe-memory-") as out, setup(config, out_dir=out, sink=NullSink()) as parts:
        after_build = rss_mib()  # the run's parts built, as the product's loop builds them
        policies = parts.sampler.policies
        params = sum(p.numel() for p in _unique_params([pol.model for pol in policies.policies.values()]))
        trainable = sum(p.numel() for pol in policies.policies.values() for p in pol.params)
        t0 = time.perf_counter()
        loop(parts, Hooks(after_step=lambda m: tokens.append(m.values["generated_tokens"])))
        seconds = time.perf_counter() - t0  # the steps, and the final checkpoint a run saves
    return {
        "specialization": args.child,
        "rss_after_imports_mib": after_imports,
        "rss_after_build_mib": after_build,
        "peak_rss_mib": peak_mib(),
        "parameters": params,
        "trainable_parameters": trainable,
        "steps": args.steps,
        "generated_tokens": sum(tokens),
        "seconds": seconds,
    }


def _unique_params(models: list[Any]) -> list[Any]:
    """Each parameter once (the `lora` policies share one PeftModel, tied embeddings share a tensor)."""
    return list({id(p): p for m in models for p in m.parameters()}.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", default="prompt,lora,full")
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS / "memory.json"))
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    payload: dict[str, Any] = {"command": command_line(), "machine_start": machine(), "runs": {}}
    passthrough = ["--model", args.model, "--steps", str(args.steps), "--tasks", str(args.tasks), "--k", str(args.k),
                   "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    for spec in args.specs.split(","):
        proc = subprocess.run([sys.executable, __file__, "--child", spec, *passthrough], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"the {spec} run failed (exit {proc.returncode})")
        payload["runs"][spec] = json.loads(lines[-1].removeprefix("RESULT "))
        print(f"{spec}: peak {payload['runs'][spec]['peak_rss_mib']:.0f} MiB", flush=True)
    base = payload["runs"].get("prompt", {}).get("peak_rss_mib")
    rows = []
    for spec, r in payload["runs"].items():
        r["ratio_to_prompt"] = r["peak_rss_mib"] / base if base else None
        rows.append([spec, r["rss_after_build_mib"], r["peak_rss_mib"], r["ratio_to_prompt"] if base else "-",
                     f"{r['parameters'] / 1e6:.1f}M", f"{r['trainable_parameters'] / 1e6:.2f}M"])
    payload["machine_end"] = machine()
    print(f"\nTwo agents (math_tool tool -> reasoner), {args.model}, {args.steps} steps, peak resident memory per fresh process")
    print(table(["specialization", "after build MiB", "peak MiB", "x prompt", "parameters", "trainable"], rows))
    print(f"\nwrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
