"""The one entry point that runs a config, whatever its `algorithm`: `grpo` goes to the AT-GRPO
loop (`training.trainer.train`, which also launches data-parallel processes), `sft` to supervised
fine-tuning (`training.sft.train_sft`). The CLI, the sweep and the web's worker call this."""

from __future__ import annotations

from pathlib import Path

from training.config import RunConfig
from training.distributed import Dist
from training.events import EventSink, TrainResult


def train(config: RunConfig, *, out_dir: str | Path, sink: EventSink, dist: Dist | None = None) -> TrainResult:
    config.validate()
    if config.algorithm == "sft":
        from training.sft import train_sft

        return train_sft(config, out_dir=out_dir, sink=sink)
    from training.trainer import train as train_grpo

    return train_grpo(config, out_dir=out_dir, sink=sink, dist=dist)
