"""Peak memory per rank and step time: data parallel (`resources.parallel: data`) against FSDP
(`fsdp`), on 1, 2 and 4 ranks.

    .venv/bin/python bench/fsdp.py [--ranks 1 2 4] [--model bundled:smollm2-135m-instruct] [--dtype bfloat16] [--steps 2] [--heap mmap]

Each (mode, ranks) arm starts its ranks fresh (torch.multiprocessing, gloo on the CPU, one torch
thread each). Every rank builds the `single` policy of one agent on the model (weights, AdamW),
shards it under `fsdp` (`training.sharding.shard_policies`; there, as in a run, only rank 0
reads the weights and the other ranks build on the meta device), then runs `--steps` GRPO updates
(`update_policy`, one optimizer step each) on its share of a fixed synthetic batch (`--groups`
prompts x `--k` completions, split over the ranks): no rollout, so what is timed and measured is
the update and the state it keeps. Memory, two ways: the training state each rank holds, counted
exactly (the bytes of its parameters, their gradients and AdamW's moments; local shards under
`fsdp`), and each rank's resident high-water mark (VmHWM, Linux; after `malloc_trim`, and
reset through /proc/self/clear_refs after the build, so the full weights loaded before sharding
do not count) during the updates, and its resident size after them; the table shows the largest
rank. Torch's CPU allocator keeps no statistics, so this is RSS: it includes Python, torch and
the tokenizer (the `base` column: RSS before the model is built). The `build peak` column is the
high-water mark of the build and the sharding (under `fsdp` rank 0 loads the whole model and
the others only receive their shards).

The heap: by default (`--heap mmap`) each rank fixes glibc's mmap threshold at 128 KiB
(`mallopt(M_MMAP_THRESHOLD)`), so every tensor buffer of that size or more is its own mapping,
returned to the OS when freed, and RSS follows the bytes alive. With glibc's own setting
(`--heap glibc`, a threshold that rises to the largest buffer freed so far, up to 32 MiB) freed
buffers stay in the heap for reuse, and FSDP's pattern (a layer's weights gathered, used and
freed, 30 times a forward and again in the backward, between activations that live on) leaves
about 1 GB of freed heap resident per rank: that hid the fall of the peak (docs/benchmarks.md).
Step time: the last update's
wall time on rank 0 (the first also allocates AdamW's state). On a shared CPU the times measure
the neighbours too: the machine's load is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, machine, table, write_json  # noqa: E402


def _kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _state_mib(model: Any, optimizer: Any) -> dict[str, float]:
    """The bytes of training state this rank stores, exactly: its parameters, their gradients and the
    optimizer's tensors (AdamW's moments), local shards only for sharded (DTensor) tensors."""
    from torch.distributed.tensor import DTensor

    def mib(tensors: Any) -> float:
        local = (t.to_local() if isinstance(t, DTensor) else t for t in tensors)
        return sum(t.numel() * t.element_size() for t in local) / 2**20

    params = [p for p in model.parameters()]
    opt = [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "numel") and v.dim() > 0]
    return {"params": mib(params), "grads": mib(p.grad for p in params if p.grad is not None), "optimizer": mib(opt)}


def _trim() -> None:
    """Give freed heap back to the OS (glibc), so RSS stops counting what sharding released."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


M_MMAP_THRESHOLD = -3
"""glibc's mallopt parameter: the size from which malloc maps a buffer on its own (mallopt(3))."""


def _fix_mmap_threshold(size: int = 128 * 1024) -> None:
    """Serve every buffer of `size` bytes or more from its own mapping, unmapped when freed (and
    stop glibc raising the threshold as larger buffers are freed)."""
    import ctypes

    if not ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, size):
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed")


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    if args.heap == "mmap":
        _fix_mmap_threshold()
    import torch
    import torch.distributed as torch_dist

    from training.config import RunConfig
    from training.distributed import Dist
    from training.policies import build_policies
    from training.sharding import builds_on_meta, local_share, shard_policies
    from training.update import Sample, update_policy

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=rank, world_size=world)
    base = _kib("VmRSS")
    config = RunConfig.from_dict(
        {
            "name": "bench-fsdp",
            "seed": 0,
            "model": {"source": args.model, "dtype": args.dtype},
            "topology": {"environment": "arithmetic", "specialization": "single", "agents": [{"name": "solver", "role": "solver"}], "max_turns": 1},
            "optim": {"tasks_per_step": max(world, 2), "micro_batch_size": args.k},
            "resources": {"gpus": world, "parallel": args.mode},
        }
    )
    dist = Dist(rank=rank, world=world)
    policies = build_policies(config, device=torch.device("cpu"), meta=builds_on_meta(config, dist))  # fsdp: only rank 0 reads the weights
    shard_policies(policies, config, dist)
    policy = policies.for_agent("solver")
    vocab = len(policy.tokenizer)
    gen = torch.Generator().manual_seed(0)
    batch = []
    for g in range(args.groups):
        prompt = tuple(torch.randint(0, vocab, (args.prompt,), generator=gen).tolist())
        for i in range(args.k):
            completion = tuple(torch.randint(0, vocab, (args.completion,), generator=gen).tolist())
            batch.append(Sample("solver", prompt, completion, advantage=0.5 * (-1.0) ** i + 0.1 * g))
    mine = batch[rank::world]
    _trim()  # the whole model loaded before sharding is freed: RSS from here on is what the rank keeps
    built = _kib("VmRSS")
    build_peak = _kib("VmHWM")  # the build and the sharding
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := the current RSS
    times = []
    for step in range(1, args.steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        stats = update_policy(policy, mine, config, step=step, dist=dist)
        times.append(time.perf_counter() - t0)
    held, total = local_share(policy.model)
    state = _state_mib(policy.model, policy.optimizer)
    result = {
        "state_mib": state,
        "rank": rank,
        "base_mib": base / 1024,
        "built_mib": built / 1024,
        "build_peak_mib": build_peak / 1024,
        "peak_mib": _kib("VmHWM") / 1024,
        "after_mib": _kib("VmRSS") / 1024,
        "step_s": times[-1],
        "first_step_s": times[0],
        "params_held": held,
        "params_total": total,
        "loss": stats["loss"],
        "grad_norm": stats["grad_norm"],
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    torch_dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(rank_main, args=(args.world, _free_port(), args, out), nprocs=args.world, join=True)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.world)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16", help="model.dtype (bfloat16 halves what 4 data-parallel ranks need)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--modes", nargs="+", choices=("data", "fsdp"), default=["data", "fsdp"])
    parser.add_argument("--heap", choices=("mmap", "glibc"), default="mmap", help="mmap: buffers of 128 KiB or more unmapped when freed; glibc: glibc's default heap")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(RESULTS / "fsdp.json"))
    args = parser.parse_args(argv)
    if args.mode:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0

    payload: dict[str, Any] = {"command": command_line(), "machine_start": machine(), "measure": "state held: bytes of params + grads + optimizer tensors per rank (local shards); VmHWM (RSS high-water mark) after malloc_trim", "heap": args.heap, "runs": []}
    passthrough = [
        *("--model", args.model, "--dtype", args.dtype, "--steps", str(args.steps), "--groups", str(args.groups)),
        *("--k", str(args.k), "--prompt", str(args.prompt), "--completion", str(args.completion), "--heap", args.heap),
    ]
    for world in args.ranks:
        for mode in args.modes:
            proc = subprocess.run([sys.executable, __file__, "--mode", mode, "--world", str(world), *passthrough], capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
                raise SystemExit(f"the {mode} arm on {world} ranks failed (exit {proc.returncode})")
            ranks = json.loads(lines[-1].removeprefix("RESULT "))
            payload["runs"].append({"mode": mode, "ranks": world, "per_rank": ranks})
    payload["machine_end"] = machine()

    def worst(run: dict[str, Any], key: str) -> float:
        return float(max(r[key] for r in run["per_rank"]))

    ref = {(r["mode"], r["ranks"]): r for r in payload["runs"]}
    rows = []
    for run in payload["runs"]:
        dp = ref.get(("data", run["ranks"]), run)  # without data-parallel arms (--modes fsdp), x data is 1
        one = ref.get((run["mode"], min(args.ranks)), run)
        r0 = run["per_rank"][0]
        run["summary"] = {
            "peak_mib": worst(run, "peak_mib"),
            "state_mib": worst(run, "peak_mib") - worst(run, "base_mib"),
            "step_s": r0["step_s"],
            "params_held_share": r0["params_held"] / r0["params_total"],
            "held_state_mib": max(sum(r["state_mib"].values()) for r in run["per_rank"]),
        }
        state, state_dp = run["summary"]["state_mib"], worst(dp, "peak_mib") - worst(dp, "base_mib")
        held_dp = max(sum(r["state_mib"].values()) for r in dp["per_rank"])
        rows.append([
            run["mode"], run["ranks"], run["summary"]["held_state_mib"], run["summary"]["held_state_mib"] / held_dp, worst(run, "base_mib"), worst(run, "build_peak_mib"), run["summary"]["peak_mib"], state, state / state_dp,
            state / (worst(one, "peak_mib") - worst(one, "base_mib")), run["summary"]["params_held_share"], r0["step_s"], r0["loss"],
        ])
    start, end = payload["machine_start"], payload["machine_end"]
    print(
        f"\n{args.steps} updates of `single` on {args.model} ({args.dtype}), {args.groups} x {args.k} samples of "
        f"{args.prompt}+{args.completion} tokens split over the ranks; CPU, gloo, 1 thread per rank, heap {args.heap}; "
        f"load average {start['loadavg'][0]} -> {end['loadavg'][0]} on {start['cpus']} CPUs"
    )
    print(table(["mode", "ranks", "state held MiB", "state x data", "base MiB", "build peak MiB", "peak MiB", "peak - base MiB", "x data", "x 1 rank", "params held", "step s", "loss"], rows))
    print(f"\nwrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
