"""Every episode of a step has GRPO groups of its own, however its tasks were drawn: the step's
batch, dynamic sampling's extra batches, epoch boundaries, a train set smaller than a batch or
not a multiple of it, any seed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.base import State
from tests.training.conftest import toy_config
from training import collect, trainer
from training.generation import Generation
from training.rollout import Candidate, Episode, Turn


def flat_episode(task_id: str) -> Episode:
    """An episode whose K candidates all got the same reward: no signal, so dynamic sampling goes on."""
    cands = [Candidate(Generation((1,), "x", False), team=0.0, local=0.0, reward=0.0) for _ in range(4)]
    return Episode(task_id, {}, [Turn(0, "writer", "writer", "p", (1,), cands, 0, (task_id, 0, "writer"))], State(task_id=task_id, row={}))


def drawn_batches(config, n_rows: int, step: int, monkeypatch) -> list[list[str]]:
    """The episode ids of every batch a step rolls out: its own, then each extra batch (no task has a signal)."""
    tasks = [(f"train-{i}", {"question": str(i)}) for i in range(n_rows)]
    batches: list[list[str]] = []

    def rollout(sampler, batch):
        batches.append([tid for tid, _ in batch])
        return [flat_episode(tid) for tid, _ in batch]

    monkeypatch.setattr(collect, "_rollout", rollout)
    sampler = type("S", (), {"config": config, "dist": type("D", (), {"rank": 0, "world": 1})()})()
    batch = collect.step_tasks(tasks, config, step)
    collect._dynamic_sampling(sampler, tasks, step, batch, collect._rollout(sampler, batch))
    return batches


def test_the_reported_case_draws_one_task_twice_in_an_extra_batch_and_gives_each_its_own_episode(make_config, monkeypatch):
    # seed 2, 5 training rows, 2 tasks per step, k 4, dynamic sampling 2: step 3's first extra batch draws row 2 twice
    config = make_config("single", seed=2, **{"data.train_size": 5, "optim.tasks_per_step": 2, "grpo.k": 4, "grpo.dynamic_sampling": 2})
    batches = drawn_batches(config, 5, 3, monkeypatch)
    assert len(batches) == 3
    assert batches[1] == ["train-2@3+1", "train-2@3+1#2"]
    ids = [tid for b in batches for tid in b]
    assert len(set(ids)) == len(ids)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**20),
    n_rows=st.integers(1, 9),
    per_step=st.integers(1, 7),
    step=st.integers(1, 12),
    rounds=st.integers(0, 3),
)
def test_no_two_episodes_of_a_step_share_an_id_whatever_the_draw(seed, n_rows, per_step, step, rounds):
    config = toy_config("single", seed=seed, **{"optim.tasks_per_step": per_step, "grpo.dynamic_sampling": rounds})
    with pytest.MonkeyPatch.context() as m:
        batches = drawn_batches(config, n_rows, step, m)
    assert len(batches) == 1 + rounds
    ids = [tid for b in batches for tid in b]
    assert len(set(ids)) == len(ids) == per_step * (1 + rounds)


def test_episode_ids_never_collide_across_tasks_whose_ids_look_like_episode_ids():
    tasks = [("x", {}), ("x@1#2", {}), ("x@1", {})]
    ids = [tid for tid, _ in collect.episode_ids(tasks, [0, 0, 1, 2, 2, 0], "1")]
    assert len(set(ids)) == len(ids) == 6


def test_a_rollout_batch_holding_one_episode_twice_is_refused():
    with pytest.raises(RuntimeError, match="appear twice"):
        collect.check_distinct_episodes([("a@1", {}), ("b@1", {}), ("a@1", {})])


def test_a_run_of_the_reported_case_keeps_each_episodes_groups_apart(make_config, tmp_path):
    from training.events import NullSink

    steps: list[list[dict]] = []

    class Keep(NullSink):
        def rollouts(self, step, episodes):
            steps.append(episodes)

    config = make_config("single", seed=2, **{"data.train_size": 5, "optim.tasks_per_step": 2, "grpo.k": 4,
                                              "grpo.dynamic_sampling": 2, "optim.steps": 3})
    assert trainer.train(config, out_dir=tmp_path, sink=Keep()).status == "succeeded"
    for episodes in steps:
        ids = [ep["task_id"] for ep in episodes]
        assert len(set(ids)) == len(ids)
