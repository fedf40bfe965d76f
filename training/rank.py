"""What every rank of a multi-process run executes: torchrun starts it on every rank of a
multi-GPU run (`training.distributed.launch`), and Ray Train's workers call `run_rank` on every
rank of a multi-host run (`training.ray_launch`).

Kept apart from `training.distributed`, which the trainer imports: the launcher never imports
the trainer that calls it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch.distributed as torch_dist

from training.config import RunConfig
from training.distributed import RelaySink, from_env
from training.events import NullSink
from training.trainer import train


def run_rank(config: RunConfig, out: Path, relay: RelaySink | None) -> None:
    """Train this rank's part of `config` in the launch the environment describes (RANK,
    WORLD_SIZE, LOCAL_RANK and the process group, as torchrun or Ray Train set them); `relay`
    is rank 0's sink (None on the other ranks): it gets every event, then the result or the error."""
    dist = from_env()
    relay = relay if dist.main else None
    try:
        result = train(config, out_dir=out, sink=relay or NullSink(), dist=dist)
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
