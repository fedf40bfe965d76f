"""What every process of a run executes: the loop of the config's algorithm (`run_loop`), called
by the runner in its own process, by torchrun on every rank of a multi-GPU run (`main`), and by
Ray Train's workers on every rank of a multi-host run (`run_rank`, from `training.ray_launch`)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as torch_dist

from training.config import RunConfig
from training.distributed import HEARTBEATS, Dist, RelaySink, from_env
from training.events import EventSink, NullSink, TrainResult
from training.plan import Plan
from training.sft import train_sft
from training.trainer import Hooks
from training.trainer import train as train_grpo
from training.watchdog import heartbeat_file


def run_loop(config: RunConfig, out: Path, sink: EventSink, *, plan: Plan, dist: Dist | None = None,
             hooks: Hooks | None = None) -> TrainResult:
    """The loop of `config.algorithm` on this rank: `sft` supervised fine-tuning, `grpo` AT-GRPO."""
    if config.algorithm == "sft":
        return train_sft(config, out_dir=out, sink=sink, plan=plan)
    return train_grpo(config, out_dir=out, sink=sink, plan=plan, dist=dist, hooks=hooks)


def run_rank(config: RunConfig, out: Path, relay: RelaySink | None) -> None:
    """Train this rank's part of `config` in the launch the environment describes (RANK,
    WORLD_SIZE, LOCAL_RANK and the process group, as torchrun or Ray Train set them); `relay`
    is rank 0's sink (None on the other ranks): it gets every event, then the result or the error.
    While the loop runs a thread writes the rank's heartbeat (`OUT/heartbeats/rank-N`), which the
    launcher watches (`training.watchdog`)."""
    dist = from_env()
    relay = relay if dist.main else None
    try:
        with heartbeat_file(out / HEARTBEATS / f"rank-{dist.rank}"):  # the launcher watches it (training.watchdog)
            result = run_loop(config, out, relay or NullSink(), plan=Plan.resolve(config), dist=dist)
    except BaseException as exc:
        if relay is not None:
            relay.fail(exc)
        raise
    if relay is not None:
        relay.finish(result)
    if torch_dist.is_initialized():  # a vLLM engine's teardown may have destroyed it already
        torch_dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """`python -m training.rank CONFIG OUT`, as torchrun starts it on every rank."""
    config_file, out = (argv or sys.argv[1:])[:2]
    run_rank(RunConfig.load(config_file), Path(out), RelaySink(Path(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
