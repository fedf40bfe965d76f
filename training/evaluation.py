"""Held-out evaluation: the team's and each agent's success on the run's held-out tasks, greedy
and sampled (`evaluate`), during a run and on a saved checkpoint (`evaluate_checkpoint`)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.envs import load_environment
from training.checkpoints import STATE_FILE
from training.config import RunConfig
from training.data import Task, load_tasks
from training.events import EventSink
from training.metrics import agent_success
from training.rollout import Episode, Sampler, checkpoint_sampler, rollout_independent

EVAL_BATCH = 64
"""Most held-out tasks generated together (an evaluation of 100 tasks runs as 2 batches of 50):
fewer would slow it down (the tiny model's 100 tasks in batches of 25 took twice the CPU time)."""

def evaluate(
    sampler: Sampler,
    tasks: list[Task],
    *,
    step: int,
    sink: EventSink | None = None,
    on_progress: Callable[[float, int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """Held-out success for the team and per agent: greedy (eval_temperature), and sampled at the
    training temperature when `eval.sampled`. Uses its own RNG so training draws are unchanged.

    The tasks go in batches of at most `EVAL_BATCH`; a long evaluation says how far it got:
    `on_progress(share, done, n)` first, after each batch's turn and at the end (`done` of the `n`
    episodes finished, `share` of the work done)."""
    cfg = sampler.config
    tasks = tasks[: cfg.eval.size]
    temps = [cfg.generation.eval_temperature]
    if cfg.eval.sampled:
        temps.append(cfg.generation.temperature)
    saved = sampler.generator.get_state()
    results = []
    n = len(tasks) * len(temps)
    batch = math.ceil(len(tasks) / math.ceil(len(tasks) / EVAL_BATCH)) if tasks else 1
    turns = cfg.topology.max_turns

    def report(done: int, share: float) -> None:
        if on_progress is not None:
            on_progress(min(1.0, share / max(n, 1)), done, n)

    report(0, 0.0)
    for i, temp in enumerate(temps):
        sampler.generator.manual_seed(cfg.seed + 99_991 * (step + 1))
        episodes: list[Episode] = []
        for start in range(0, len(tasks), batch):
            chunk, before = tasks[start : start + batch], i * len(tasks) + len(episodes)
            episodes += rollout_independent(
                sampler, chunk, k=1, temperature=temp, on_turn=partial(_turn_done, report, before, len(chunk), turns)
            )
            report(before + len(chunk), before + len(chunk))
        agents: dict[str, dict[str, float]] = {}
        for name in dict.fromkeys(cfg.topology.order()):
            mine = [t.candidates[0] for ep in episodes for t in ep.turns if t.agent == name]
            agents[name] = {
                "success": agent_success(episodes, name),
                "reward": float(np.mean([c.local for c in mine])) if mine else 0.0,
            }
        result = {
            "step": step,
            "split": "eval",
            "temperature": temp,
            "n": len(episodes),
            "team": {"success": float(np.mean([ep.success for ep in episodes])) if episodes else 0.0},
            "agents": agents,
            "examples": [ep.to_dict(step) for ep in episodes[:3]],
        }
        results.append(result)
        if sink is not None:
            sink.evaluation(result)
    sampler.generator.set_state(saved)
    return results

def _turn_done(report: Callable[[int, float], None], before: int, size: int, turns: int, turn: int, finished: int) -> None:
    """A batch of `size` evaluation episodes after the `before` finished ones has done `turn` of
    its `turns` turns, `finished` of its episodes ended (the batch's end is reported with its
    episodes). The work done counts an ended episode whole and the others by their turns."""
    if turn < turns:
        report(before + finished, before + finished + (size - finished) * turn / turns)

def evaluate_checkpoint(config: RunConfig, checkpoint: str | Path | None, *, sink: EventSink | None = None) -> list[dict[str, Any]]:
    """Evaluate a saved checkpoint on the run's held-out tasks, or (checkpoint None) the weights a
    run of `config` starts from: the base models, or its warm start (`model.init_from`), as the run's
    step-0 evaluation sees them."""
    env = load_environment(config.topology.environment, **config.topology.env_args)
    _, eval_tasks = load_tasks(config, env)
    step = 0
    if checkpoint is not None and (state_file := Path(checkpoint) / STATE_FILE).exists():
        step = int(torch.load(state_file, weights_only=False)["step"])
    with starting_sampler(config, env, checkpoint) as sampler:
        return evaluate(sampler, eval_tasks, step=step, sink=sink)


@contextlib.contextmanager
def starting_sampler(config: RunConfig, env: Any, checkpoint: str | Path | None, *, seed: int | None = None) -> Iterator[Sampler]:
    """`training.rollout.checkpoint_sampler`, where no checkpoint means the weights a run of
    `config` starts from: its warm start (`model.init_from`) when it names one, else the base
    models. Evaluations, the `untrained` ablation and the playground's untrained lanes all see
    the run's step 0 through it."""
    from training.warmstart import init_from

    with checkpoint_sampler(config, env, checkpoint, seed=seed) as sampler:
        if checkpoint is None:
            init_from(config, sampler.policies)
        yield sampler
