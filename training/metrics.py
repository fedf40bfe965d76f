"""A step's metrics from its episodes: rewards, success, lengths, tool calls, per agent."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import torch

from training.grpo import zero_std_fraction
from training.rollout import Episode


def rollout_metrics(
    episodes: list[Episode], cands: list[tuple[Any, Any]], rewards: torch.Tensor, keys: list[Any], per_agent: dict[str, dict[str, float]]
) -> dict[str, float]:
    values = {
        "reward/total": float(rewards.mean()),
        "reward/team": float(np.mean([c.team for _, c in cands])),
        "reward/local": float(np.mean([c.local for _, c in cands])),
        "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
        "success": float(np.mean([ep.success for ep in episodes])),
        "zero_std_frac": zero_std_fraction(rewards, keys),
        "completion_len": float(np.mean([c.generation.model_tokens for _, c in cands])),
        "truncated": float(np.mean([c.generation.truncated for _, c in cands])),
        "ended": float(np.mean([not c.generation.truncated for _, c in cands])),
        "turns": float(np.mean([len(ep.turns) for ep in episodes])),
    }
    for name in dict.fromkeys(name for _, c in cands for name in c.reward_parts):  # each reward function, before its weight,
        values[f"reward/fn/{name}"] = float(np.mean([c.reward_parts[name] for _, c in cands if name in c.reward_parts]))  # where it applied
    if any(c.generation.calls for _, c in cands):  # agents with tools: calls per candidate, and the share that failed
        values["segment_len"] = float(np.mean([c.generation.longest_segment for _, c in cands]))  # what max_new_tokens caps
        calls = [call for _, c in cands for call in c.generation.calls]
        values["tool_calls"] = len(calls) / len(cands)
        values["tool_errors"] = float(np.mean([bool(call["error"]) for call in calls]))
    by_agent: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    for turn, c in cands:
        by_agent[turn.agent].append((turn, c))
    for agent, items in by_agent.items():
        r = torch.tensor([c.reward for _, c in items])
        per_agent[agent].update(
            {
                "reward/total": float(r.mean()),
                "reward/team": float(np.mean([c.team for _, c in items])),
                "reward/local": float(np.mean([c.local for _, c in items])),
                "reward/std": float(r.std()) if len(r) > 1 else 0.0,
                "success": agent_success(episodes, agent),
                "completion_len": float(np.mean([c.generation.model_tokens for _, c in items])),
                "truncated": float(np.mean([c.generation.truncated for _, c in items])),
                "ended": float(np.mean([not c.generation.truncated for _, c in items])),
                "zero_std_frac": zero_std_fraction(r, [t.group for t, _ in items]),
                "adv/mean": float(np.mean([c.advantage for _, c in items])),
                "adv/std": float(np.std([c.advantage for _, c in items])),
            }
        )
    return values

def agent_success(episodes: list[Episode], agent: str) -> float:
    """An agent's success: the share of the episodes it acted in that the environment judged
    solved at their end (`State.success`, the team's outcome). Its own local reward does not
    count: a format reward or a partial credit would make a wrong answer look like a success.
    0.0 when the agent never acted."""
    mine = [ep.success for ep in episodes if any(t.agent == agent for t in ep.turns)]
    return float(np.mean(mine)) if mine else 0.0
