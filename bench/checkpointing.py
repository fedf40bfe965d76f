"""Peak memory of one GRPO update with and without gradient checkpointing (`model.gradient_checkpointing`).

    .venv/bin/python bench/checkpointing.py [--spec lora] [--groups 2] [--k 8] [--prompt 256] [--completion 256]

Each arm runs in a fresh Python process: it builds one agent's policy (`--spec`: `single`, `lora`
or `full`) on the bundled SmolLM2-135M-Instruct, then runs one `update_policy` on the same
synthetic batch (`--groups` prompts of `--prompt` tokens, `--k` completions of `--completion`
tokens each, seeded token ids), with the run's micro-batch limits (`--micro-tokens`). Measured
around the update alone: on CUDA `torch.cuda.max_memory_allocated` above what was allocated before
it; on CPU the resident high-water mark (VmHWM, reset through /proc/self/clear_refs just before the
update) above the resident size before it (weights paged in first). The ratio divides the checkpointed arm's update memory
by the plain arm's, both measured in the same invocation on the same machine. The two arms' loss
and gradient norm are printed too: they must agree (same batch, same weights).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, machine, table, write_json  # noqa: E402


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Runs inside the fresh process: build, one update, report."""
    import torch

    from training.config import RunConfig
    from training.policies import build_policies
    from training.update import Sample, update_policy

    torch.set_num_threads(args.threads or torch.get_num_threads())
    agents = [{"name": "solver", "role": "solver"}]
    config = RunConfig.from_dict(
        {
            "name": "bench-checkpointing",
            "seed": 0,
            "model": {"source": args.model, "gradient_checkpointing": args.child == "checkpointing"},
            "topology": {"environment": "arithmetic", "specialization": args.spec, "agents": agents, "max_turns": 1},
            "optim": {"micro_batch_size": args.groups * args.k, "micro_batch_tokens": args.micro_tokens},
            "generation": {"max_new_tokens": args.completion},
        }
    )
    config.validate()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    policy = build_policies(config, device=device).for_agent("solver")
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(0)
    samples = []
    for g in range(args.groups):
        prompt = tuple(torch.randint(0, vocab, (args.prompt,), generator=gen).tolist())
        for i in range(args.k):
            completion = tuple(torch.randint(0, vocab, (args.completion,), generator=gen).tolist())
            samples.append(Sample("solver", prompt, completion, advantage=0.5 * (-1.0) ** i + 0.1 * g))
    with torch.no_grad():  # page the memory-mapped weights in, so the update's figure is the update's own
        for p in policy.model.parameters():
            p.sum()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        before = _status_kib("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    t0 = time.perf_counter()
    stats = update_policy(policy, samples, config, step=1)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = _status_kib("VmHWM") * 1024
    return {
        "arm": args.child,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "measure": "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM",
        "before_mib": before / 2**20,
        "peak_mib": peak / 2**20,
        "update_mib": (peak - before) / 2**20,
        "seconds": time.perf_counter() - t0,
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="lora", choices=["single", "lora", "full"])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--micro-tokens", type=int, default=8192, help="optim.micro_batch_tokens")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS / "checkpointing.json"))
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    payload: dict[str, Any] = {"command": command_line(), "machine_start": machine(), "runs": {}}
    passthrough = [
        *("--spec", args.spec, "--model", args.model, "--groups", str(args.groups), "--k", str(args.k)),
        *("--prompt", str(args.prompt), "--completion", str(args.completion), "--micro-tokens", str(args.micro_tokens)),
        *("--threads", str(args.threads)),
    ]
    for arm in ("plain", "checkpointing"):
        proc = subprocess.run([sys.executable, __file__, "--child", arm, *passthrough], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"the {arm} arm failed (exit {proc.returncode})")
        payload["runs"][arm] = json.loads(lines[-1].removeprefix("RESULT "))
    plain = payload["runs"]["plain"]
    rows = []
    for arm, r in payload["runs"].items():
        r["ratio_to_plain"] = r["update_mib"] / plain["update_mib"]
        rows.append([arm, r["before_mib"], r["peak_mib"], r["update_mib"], r["ratio_to_plain"], r["seconds"], r["loss"], r["grad_norm"]])
    payload["machine_end"] = machine()
    print(
        f"\nOne update, {args.spec}, {args.model} on {plain['device']} ({plain['measure']}): {args.groups} groups x {args.k} "
        f"completions, prompts {args.prompt} tokens, completions {args.completion}"
    )
    print(table(["arm", "before MiB", "peak MiB", "update MiB", "x plain", "seconds", "loss", "grad_norm"], rows))
    print(f"\nwrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
