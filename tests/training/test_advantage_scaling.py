"""What one advantage is normalised against. `scale_rewards: batch` takes each agent's own std
(agents' rewards need not share a scale), over the whole step on every rank (gathered first, as
TRL does); under independent sampling an agent's part of one trajectory is one sample of its
(task, agent) group's baseline, however many turns it took."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from agents.base import State
from training.distributed import Dist
from training.generation import Generation
from training.grpo import group_advantages
from training.rollout import Candidate, Episode, Turn
from training.shaping import step_advantages


def cand(r: float) -> Candidate:
    return Candidate(Generation((1,), "x", False), team=0.0, local=r, reward=r)


def tree_episode(task: str, turns: list[tuple[str, list[float]]]) -> Episode:
    return Episode(task, {}, [Turn(i, a, a, "p", (1,), [cand(r) for r in rs], 0, (task, i, a)) for i, (a, rs) in enumerate(turns)],
                   State(task_id=task, row={}))


def advantages(episodes: list[Episode]) -> list[float]:
    return [c.advantage for ep in episodes for t in ep.turns for c in t.candidates]


def test_batch_scaling_takes_each_agents_own_std():
    rewards = torch.tensor([0.0, 10.0, 10.0, 0.0, 1.0, 0.0])
    groups = ["a1", "a1", "a2", "a2", "b1", "b1"]
    adv = group_advantages(rewards, groups, scale="batch", eps=0.0, batch_ids=["A"] * 4 + ["B"] * 2)
    a_std, b_std = statistics.stdev([0, 10, 10, 0]), statistics.stdev([1, 0])
    assert adv.tolist() == pytest.approx([-5 / a_std, 5 / a_std, 5 / a_std, -5 / a_std, 0.5 / b_std, -0.5 / b_std])
    alone = group_advantages(rewards[4:], groups[4:], scale="batch", eps=0.0)
    assert adv[4:].tolist() == pytest.approx(alone.tolist())  # agent A's tenfold rewards do not shrink B's signal


def test_a_steps_batch_scaling_is_per_agent(make_config):
    config = make_config("lora", **{"grpo.scale_rewards": "batch", "grpo.adv_eps": 1e-12})
    episodes = [tree_episode("t1", [("writer", [0.0, 10.0]), ("echo", [0.0, 1.0])]), tree_episode("t2", [("writer", [10.0, 0.0]), ("echo", [1.0, 1.0])])]
    adv = step_advantages(episodes, config, Dist())
    echo_std = statistics.stdev([0, 1, 1, 1])
    assert adv[2:4] == pytest.approx([-0.5 / echo_std, 0.5 / echo_std])
    assert adv[6:8] == [0.0, 0.0]


@dataclass(frozen=True)
class OtherRanks(Dist):
    """A rank of a data-parallel launch whose collective `gather` returns the other ranks' objects."""

    others: tuple[Any, ...] = ()

    def gather(self, obj: Any) -> list[Any]:
        parts = list(self.others)
        parts.insert(self.rank, obj)
        return parts


@dataclass(frozen=True)
class Spy(Dist):
    """One process that keeps what it would send to the other ranks."""

    sent: list[Any] | None = None

    def gather(self, obj: Any) -> list[Any]:
        assert self.sent is not None
        self.sent.append(obj)
        return [obj]


def units_of(episodes: list[Episode], config) -> list[Any]:
    """What a rank contributes to the gather: one (reward, group, agent) per sample of the baseline."""
    spy = Spy(sent=[])
    step_advantages(episodes, config, spy)
    assert spy.sent is not None
    return spy.sent[0]


@pytest.mark.parametrize("scale", ["batch", "group", "none"])
def test_under_data_parallelism_the_advantages_are_computed_on_the_gathered_step(make_config, scale):
    config = make_config("lora", **{"grpo.scale_rewards": scale})
    rank0 = [tree_episode("t1", [("writer", [0.0, 1.0]), ("echo", [0.0, 4.0])])]
    rank1 = [tree_episode("t2", [("writer", [5.0, 0.0]), ("echo", [2.0, 2.0])]), tree_episode("t3", [("writer", [1.0, 3.0])])]
    whole = step_advantages(rank0 + rank1, config, Dist())
    as_rank1 = step_advantages(rank1, config, OtherRanks(rank=1, world=2, others=(units_of(rank0, config),)))
    as_rank0 = step_advantages(rank0, config, OtherRanks(rank=0, world=2, others=(units_of(rank1, config),)))
    assert as_rank0 + as_rank1 == pytest.approx(whole)
    if scale == "batch":  # normalising each rank's share alone would give other advantages
        assert step_advantages(rank1, config, Dist()) != pytest.approx(as_rank1)


def independent_episode(task: str, agent_turns: list[str], ret: float) -> Episode:
    """A plain-GRPO trajectory: every turn of an agent carries that agent's return."""
    return Episode(task, {}, [Turn(i, a, a, "p", (1,), [cand(ret)], 0, (task, a)) for i, a in enumerate(agent_turns)],
                   State(task_id=task, row={}))


def test_under_independent_sampling_a_three_turn_trajectory_counts_once_in_its_groups_baseline(make_config):
    config = make_config("single", **{"grpo.sampling": "independent"})
    long = independent_episode("t@1", ["writer"] * 3, 1.0)  # acted three times, return 1
    short = independent_episode("t@1", ["writer"], 0.0)  # acted once, return 0
    adv = step_advantages([long, short], config, Dist())
    want = group_advantages(torch.tensor([1.0, 0.0]), ["g", "g"], eps=config.grpo.adv_eps).tolist()  # one sample per trajectory
    assert adv == pytest.approx([want[0]] * 3 + [want[1]])
    assert adv[0] == pytest.approx(-adv[3])  # the baseline is the midpoint, not 0.75


def test_under_independent_sampling_each_agent_of_a_trajectory_is_one_sample_of_its_own_group(make_config):
    config = make_config("lora", **{"grpo.sampling": "independent", "grpo.scale_rewards": "batch", "grpo.adv_eps": 1e-12})
    eps = [
        Episode("t", {}, [Turn(0, "writer", "writer", "p", (1,), [cand(3.0)], 0, ("t", "writer")),
                          Turn(1, "echo", "echo", "p", (1,), [cand(0.5)], 0, ("t", "echo")),
                          Turn(2, "writer", "writer", "p", (1,), [cand(3.0)], 0, ("t", "writer"))], State(task_id="t", row={})),
        Episode("t", {}, [Turn(0, "writer", "writer", "p", (1,), [cand(1.0)], 0, ("t", "writer")),
                          Turn(1, "echo", "echo", "p", (1,), [cand(0.0)], 0, ("t", "echo"))], State(task_id="t", row={})),
    ]
    adv = step_advantages(eps, config, Dist())
    w, e = statistics.stdev([3, 1]), statistics.stdev([0.5, 0.0])
    assert adv == pytest.approx([1 / w, 0.25 / e, 1 / w, -1 / w, -0.25 / e])
