"""Reward shaping and advantages for one step's episodes: DAPO's soft overlong penalty, each
candidate's advantage within its (task, turn, agent) group, and which groups enter the update."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from training.config import RunConfig
from training.distributed import Dist
from training.grpo import group_advantages, soft_overlong_penalty
from training.rollout import Episode


def candidates(episodes: list[Episode]) -> tuple[list[tuple[Any, Any]], torch.Tensor, list[Any]]:
    """Every (turn, candidate) of the episodes, their rewards (N,) and their GRPO group keys."""
    cands = [(turn, c) for ep in episodes for turn in ep.turns for c in turn.candidates]
    rewards = torch.tensor([c.reward for _, c in cands], dtype=torch.float32)  # (N,)
    return cands, rewards, [turn.group for turn, _ in cands]

def step_advantages(episodes: list[Episode], cfg: RunConfig, dist: Dist) -> list[float]:
    """Each candidate's advantage (in `candidates` order), from the step's rewards on every rank.

    The baseline counts each sample once: under tree sampling a sample is a candidate; under
    independent sampling it is one agent's part of one trajectory (all its turns there share that
    trajectory's return), so an agent that acted three times in a trajectory does not weigh three
    times in its (task, agent) group's mean and std. Every turn then takes its trajectory's
    advantage. `scale_rewards: batch` divides by the std of the agent's samples in the whole
    step (`group_advantages`' batch_ids): per agent, because agents' rewards need not share a
    scale; over every rank's samples, gathered first, as TRL gathers before it normalises. A
    rank's groups are its own (it rolls out whole tasks), so `group` and `none` give the same
    values either way."""
    per_trajectory = cfg.grpo.sampling == "independent"
    units: list[tuple[float, Any, str]] = []  # (reward, group, agent) of each sample the baseline counts
    unit_of: list[int] = []  # each candidate's sample
    for ep in episodes:
        mine: dict[str, int] = {}
        for turn in ep.turns:
            for c in turn.candidates:
                if not per_trajectory or turn.agent not in mine:
                    mine[turn.agent] = len(units)
                    units.append((c.reward, turn.group, turn.agent))
                unit_of.append(mine[turn.agent])
    parts = dist.gather(units)
    offset = sum(len(part) for part in parts[: dist.rank])
    everyone = [u for part in parts for u in part]
    adv = group_advantages(
        torch.tensor([r for r, _, _ in everyone], dtype=torch.float32),  # (U,)
        [g for _, g, _ in everyone],
        scale=cfg.grpo.scale_rewards,
        eps=cfg.grpo.adv_eps,
        batch_ids=[a for _, _, a in everyone],
    )[offset : offset + len(units)].tolist()  # (U_rank,)
    return [adv[u] for u in unit_of]

def shape_overlong(episodes: list[Episode], cfg: RunConfig) -> None:
    """Add DAPO's soft overlong penalty (`soft_overlong_penalty`) to every candidate's reward.

    max_new_tokens caps each generation, so the penalty judges the candidate's longest segment
    against it: a turn that calls a tool and writes 84 + 53 tokens under a cap of 100 is not
    punished (its longest segment has 84). Under independent sampling an agent's penalties in a
    trajectory add up, as its local rewards do, and each of its turns there gets the sum (they
    share one return)."""
    per_trajectory = cfg.grpo.sampling == "independent"
    for ep in episodes:
        total: dict[str, float] = defaultdict(float)
        for turn in ep.turns:
            cap = cfg.agent(turn.agent).max_new_tokens or cfg.generation.max_new_tokens
            for c in turn.candidates:
                penalty = soft_overlong_penalty(c.generation.longest_segment, max_len=cap, cache=cfg.grpo.overlong_cache)
                if per_trajectory:
                    total[turn.agent] += penalty
                else:
                    c.reward += penalty
        if per_trajectory:
            for turn in ep.turns:
                for c in turn.candidates:
                    c.reward += total[turn.agent]

def groups_to_update(cands: list[tuple[Any, Any]], *, beta: float) -> set[Any]:
    """The GRPO groups whose candidates enter the update.

    A group whose candidates all got the same reward has zero advantages. With beta == 0 it adds
    nothing to the gradient and is left out (less compute; the loss's sample and token counts
    then cover the groups with a signal, as after DAPO's dynamic-sampling filter, where TRL
    would count them in the denominators). With beta > 0 its candidates still carry the KL
    penalty to the reference, so every group stays in, as in TRL."""
    by_group: dict[Any, list[float]] = defaultdict(list)
    for turn, c in cands:
        by_group[turn.group].append(c.reward)
    if beta > 0:
        return set(by_group)
    return {g for g, rs in by_group.items() if len(rs) > 1 and max(rs) - min(rs) > 1e-9}
