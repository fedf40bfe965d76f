"""The one entry point that runs a config. It resolves the run's plan (`training.plan`), then
starts the processes the plan names: this one, torchrun's ranks on this host
(`training.distributed.launch`), or Ray's ranks over several hosts (`training.ray_launch.launch`).
Every rank then calls the loop of the config's algorithm (`training.rank.run_loop`: `grpo` the
AT-GRPO loop, `sft` supervised fine-tuning). Nothing below this module launches anything.

The CLI, the experiments' sweep and the web's worker call `train`.
"""

from __future__ import annotations

from pathlib import Path

from training.config import RunConfig
from training.distributed import check_gpus, launch
from training.events import EventSink, TrainResult
from training.plan import Plan
from training.rank import run_loop
from training.trainer import Hooks


def train(config: RunConfig, *, out_dir: str | Path, sink: EventSink, hooks: Hooks | None = None) -> TrainResult:
    """Run `config` to its end (or until `sink` asks to stop), reporting to `sink`. `hooks` (a
    benchmark's, a research harness's) reach the loop of a one-process run."""
    config.validate()
    plan = Plan.resolve(config)
    out = Path(out_dir)
    if plan.launcher == "ray":
        from training import ray_launch  # imports Ray: only a run on several hosts

        return ray_launch.launch(config, out, sink)
    if plan.launcher == "torchrun":
        return launch(config, out, sink)  # type: ignore[no-any-return]
    if config.resources.gpus > 1:  # one process on several GPUs (`parallel: agents`)
        check_gpus(config)
    return run_loop(config, out, sink, plan=plan, hooks=hooks)
