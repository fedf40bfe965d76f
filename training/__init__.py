"""The Troupe engine: multi-agent GRPO (AT-GRPO) over a team of LLM agents.

Entry points:
- `training.config.RunConfig`: the whole run as one validated, frozen dataclass tree.
- `training.trainer.train(config, out_dir=..., sink=...)`: runs the loop, reporting through an
  `training.events.EventSink`; returns a `TrainResult`.
- `python -m training run CONFIG.yaml`: the same from the command line.

Never imports Django.
"""
