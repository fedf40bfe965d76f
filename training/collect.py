"""What a step trains on: the step's tasks (drawn so a resume replays them), its rollouts (tree or
independent sampling) with DAPO's dynamic sampling, here or in the async sampler that works one
step ahead (`start_async_rollouts`, where the run's plan puts it)."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from training.async_rollout import LAGS, AsyncRollouts, Collect, StepRollouts
from training.config import RunConfig
from training.data import Task, batch_indices
from training.placement import generating
from training.plan import Plan
from training.rollout import Episode, Sampler, rollout_independent, rollout_tree


def start_async_rollouts(sampler: Sampler, tasks: list[Task], *, plan: Plan, total_steps: int,
                         collect: Collect | None = None) -> AsyncRollouts | None:
    """The sampler that makes the run's rollouts on a copy of its weights (training.async_rollout):
    `generation.async`'s, working one step ahead of the update on `tasks`, in a process or a thread
    as `plan.sampler` says; or, for a synchronous run whose rollouts come from a bfloat16 copy
    (`plan.sampler_dtype`), one that makes each step's rollouts when the step asks (lag 0). None
    when the trainer's own weights make them. `collect` replaces `collect_rollouts`
    (bench/engine_vs_trl.py rolls out each step from an empty sandbox cache)."""
    dtype = getattr(torch, plan.sampler_dtype) if plan.sampler_dtype else None
    if plan.sampler == "off" and dtype is None:
        return None
    lag = LAGS[sampler.config.generation.async_] if plan.sampler != "off" else 0
    return AsyncRollouts(sampler, tasks, collect or collect_rollouts, lag=lag, total_steps=total_steps,
                         process=plan.sampler == "process", dtype=dtype)


def collect_rollouts(sampler: Sampler, tasks: list[Task], step: int) -> StepRollouts:
    """Step `step`'s episodes (each process of a data-parallel launch takes its share of the
    tasks), with dynamic sampling's extra batches; in the async sampler when `generation.async`."""
    cfg, dist = sampler.config, sampler.dist
    t0 = time.perf_counter()
    tokens0, secs0 = sampler.stats.tokens, sampler.stats.seconds
    batch = step_tasks(tasks, cfg, step)[dist.rank :: dist.world]
    with generating(sampler):  # sharded models gathered whole; a placement's ranks answer each other
        episodes = _rollout(sampler, batch)
        dynamic: dict[str, float] = {}
        if cfg.grpo.dynamic_sampling:
            episodes, dynamic = _dynamic_sampling(sampler, tasks, step, batch, episodes)
    return StepRollouts(step, episodes, dynamic, time.perf_counter() - t0, sampler.stats.tokens - tokens0,
                        sampler.stats.seconds - secs0, version=step - 1)

def _rollout(sampler: Sampler, batch: list[Task]) -> list[Episode]:
    cfg = sampler.config
    check_distinct_episodes(batch)
    if cfg.grpo.sampling == "tree":
        return rollout_tree(sampler, batch)
    return rollout_independent(sampler, batch, k=cfg.grpo.k)

def signal_tasks(episodes: list[Episode]) -> list[str]:
    """The task ids, in order, of the episodes with at least one GRPO group whose candidates'
    rewards differ (under independent sampling a task's K episodes share its groups)."""
    rewards: dict[Any, list[float]] = defaultdict(list)
    for ep in episodes:
        for turn in ep.turns:
            rewards[turn.group] += [c.reward for c in turn.candidates]
    live = {g for g, rs in rewards.items() if max(rs) - min(rs) > 1e-9}
    return list(dict.fromkeys(ep.task_id for ep in episodes if any(t.group in live for t in ep.turns)))

def _dynamic_sampling(
    sampler: Sampler, tasks: list[Task], step: int, batch: list[Task], episodes: list[Episode]
) -> tuple[list[Episode], dict[str, float]]:
    """DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2): keep the step's tasks that give a signal
    and roll out more batches of other tasks (at most `grpo.dynamic_sampling`) until there are as
    many such tasks as the step had. Extra batch r of step s draws `batch_indices` with the seed
    offset by r: the same tasks on a resume. With none found, the step keeps its episodes (their
    groups carry no gradient; see `groups_to_update`)."""
    cfg, dist = sampler.config, sampler.dist
    want = len(dict.fromkeys(tid for tid, _ in batch))
    kept = signal_tasks(episodes)
    pool = list(episodes)
    rounds = 0
    while len(kept) < want and rounds < cfg.grpo.dynamic_sampling:
        rounds += 1
        more = _rollout(sampler, extra_tasks(tasks, cfg, step, rounds)[dist.rank :: dist.world])
        pool += more
        kept += [tid for tid in signal_tasks(more) if tid not in kept]
    stats = {"dynamic/extra_batches": float(rounds), "dynamic/signal_tasks": float(min(len(kept), want)) / max(want, 1)}
    if not kept:
        return episodes, stats
    chosen = set(kept[:want])
    return [ep for ep in pool if ep.task_id in chosen], stats

def step_tasks(tasks: list[Task], cfg: RunConfig, step: int) -> list[Task]:
    """The step's (episode id, row) pairs, before a data-parallel launch splits them (`episode_ids`
    names them `3@7`, `3@7#2`)."""
    return episode_ids(tasks, batch_indices(len(tasks), cfg.optim.tasks_per_step, step, cfg.seed), f"{step}")

def extra_tasks(tasks: list[Task], cfg: RunConfig, step: int, round_: int) -> list[Task]:
    """Dynamic sampling's extra batch `round_` (1-based) of a step: the draw of `batch_indices` with
    the seed offset by 7919 * round_, named `3@7+1`, `3@7+1#2` (`episode_ids`)."""
    indices = batch_indices(len(tasks), cfg.optim.tasks_per_step, step, cfg.seed + 7_919 * round_)
    return episode_ids(tasks, indices, f"{step}+{round_}")

def episode_ids(tasks: list[Task], indices: list[int], draw: str) -> list[Task]:
    """(episode id, row) for each drawn index: the task's id, `@`, the draw (`7`, or `7+1` for an
    extra batch of step 7) and, from a task's second occurrence in the same draw on (a batch that
    crosses an epoch boundary, or a train set smaller than the batch), `#n`. Every episode of a
    step thus has an id of its own, so its candidates never share a GRPO group (task, turn, agent)
    with another episode's, whose state differs. The id after the last `@` names the draw, so two
    different (task, draw, n) never give the same id."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for i in indices:
        tid, row = tasks[i]
        seen[tid] += 1
        out.append((f"{tid}@{draw}" + (f"#{seen[tid]}" if seen[tid] > 1 else ""), row))
    return out

def check_distinct_episodes(batch: list[Task]) -> None:
    """Refuse a batch in which two episodes share an id: their candidates would fall into one GRPO
    group although their states differ (a bug in how the batch was drawn, never the user's)."""
    ids = [tid for tid, _ in batch]
    if len(set(ids)) != len(ids):
        twice = sorted({tid for tid in ids if ids.count(tid) > 1})
        raise RuntimeError(f"episodes {twice} appear twice in one rollout batch: each episode needs its own GRPO groups")
