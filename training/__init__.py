"""The Troupe engine: multi-agent GRPO (AT-GRPO) over a team of LLM agents.

Entry points:
- `training.config.RunConfig`: the whole run as one validated, frozen dataclass tree.
- `training.runner.train(config, out_dir=..., sink=...)`: runs a run, reporting through an
  `training.events.EventSink`; returns a `TrainResult`. `algorithm: grpo` runs the AT-GRPO loop
  (`training.trainer.train`), `algorithm: sft` supervised fine-tuning (`training.sft.train_sft`).
- `python -m training run CONFIG.yaml`: the same from the command line.

Never imports Django.
"""
