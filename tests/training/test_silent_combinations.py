"""Valid config combinations that probably mean something else get a warning in the run's log;
resume compares every field that decides which tasks fill a step; per-agent success is the
environment's outcome, not a positive local reward."""

from __future__ import annotations

import pytest
import torch

from agents.base import State
from tests.training.toy_env import LetterEnv
from training import collect, evaluation, metrics, trainer
from training.config import config_warnings, resume_differences
from training.data import load_tasks
from training.events import NullSink
from training.generation import Generation
from training.rollout import Candidate, Episode, Turn


class Logs(NullSink):
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def log(self, message, *, level="info"):
        self.lines.append((level, message))


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "dr_grpo", "cispo"])
def test_gspo_with_a_token_sum_aggregation_is_warned_about(make_config, loss_type):
    config = make_config("single", **{"grpo.ratio_level": "sequence", "grpo.loss_type": loss_type})
    (warning,) = config_warnings(config)
    assert "grpo.ratio_level: sequence" in warning and f"grpo.loss_type: {loss_type}" in warning and "loss_type: grpo" in warning


def test_gspo_with_sequence_mean_aggregation_and_plain_grpo_say_nothing(make_config):
    assert config_warnings(make_config("single", **{"grpo.ratio_level": "sequence", "grpo.loss_type": "grpo"})) == []
    assert config_warnings(make_config("single")) == []


def test_delta_under_cispo_is_warned_about(make_config):
    (warning,) = config_warnings(make_config("single", **{"grpo.loss_type": "cispo", "grpo.delta": 2.0}))
    assert "grpo.delta" in warning and "cispo" in warning


def test_the_warning_is_in_the_runs_log(make_config, tmp_path):
    sink = Logs()
    config = make_config("single", **{"grpo.ratio_level": "sequence", "optim.steps": 1})
    assert trainer.train(config, out_dir=tmp_path, sink=sink).status == "succeeded"
    assert any(level == "warning" and "GSPO" in message for level, message in sink.lines)


# == resume ===============================================================================================


def drawn(config, steps: int = 4) -> list[list[str]]:
    """The ids and rows of every batch the first steps may roll out: each step's own and its
    dynamic-sampling extra batches (which of them fill the step then depends on the rewards)."""
    tasks, _ = load_tasks(config, LetterEnv())
    out = []
    for step in range(1, steps + 1):
        for batch in [collect.step_tasks(tasks, config, step)] + [
            collect.extra_tasks(tasks, config, step, r) for r in range(1, config.grpo.dynamic_sampling + 1)
        ]:
            out.append([f"{tid}:{row['question']}" for tid, row in batch])
    return out


@pytest.mark.parametrize("override", [
    {"grpo.dynamic_sampling": 2}, {"seed": 3}, {"optim.tasks_per_step": 3}, {"data.train_size": 5},
    {"optim.lr": 0.5}, {"optim.steps": 9}, {"grpo.beta": 0.1}, {"generation.max_new_tokens": 16}, {"eval.every": 1},
    {"grpo.scale_rewards": "batch"}, {"grpo.loss_type": "grpo"}, {"resources.gpus": 2},
])
def test_resume_compares_every_field_that_changes_which_tasks_fill_a_step(make_config, override):
    base = make_config("single", **{"grpo.dynamic_sampling": 1})
    changed = base.replace(**override)
    if drawn(changed) != drawn(base):
        assert resume_differences(base, changed), f"{override} draws other tasks but a resume would not notice"


def test_resume_names_a_changed_dynamic_sampling(make_config):
    base = make_config("single")
    assert resume_differences(base, base.replace(**{"grpo.dynamic_sampling": 2})) == ["grpo.dynamic_sampling: 0 -> 2"]


# == per-agent success =====================================================================================


def episode(task: str, locals_: dict[str, float], success: bool) -> Episode:
    turns = [
        Turn(i, agent, agent, "p", (1,), [Candidate(Generation((1,), "x", False), team=0.0, local=r, reward=r)], 0,
             (task, i, agent))
        for i, (agent, r) in enumerate(locals_.items())
    ]
    return Episode(task, {}, turns, State(task_id=task, row={}, success=success))


def test_a_positive_local_reward_is_no_success():
    # a format reward (+0.2) on a wrong answer, and a solved task where the tool's local reward was 0
    episodes = [episode("a", {"tool": 0.2, "reasoner": 0.2}, False), episode("b", {"tool": 0.0, "reasoner": 1.0}, True),
                episode("c", {"tool": 0.5}, False)]
    assert metrics.agent_success(episodes, "tool") == pytest.approx(1 / 3)
    assert metrics.agent_success(episodes, "reasoner") == pytest.approx(1 / 2)
    assert metrics.agent_success(episodes, "nobody") == 0.0


def test_the_training_metrics_per_agent_use_the_environments_success():
    episodes = [episode("a", {"tool": 0.2, "reasoner": 0.2}, False), episode("b", {"tool": 0.0, "reasoner": 1.0}, True)]
    cands = [(t, c) for ep in episodes for t in ep.turns for c in t.candidates]
    per_agent: dict[str, dict[str, float]] = {"tool": {}, "reasoner": {}}
    metrics.rollout_metrics(episodes, cands, torch.tensor([c.reward for _, c in cands]), [t.group for t, _ in cands], per_agent)
    assert per_agent["tool"]["success"] == 0.5 and per_agent["reasoner"]["success"] == 0.5


def test_held_out_success_per_agent_is_the_environments_outcome(make_config):
    from training.policies import build_policies
    from training.rollout import Sampler

    class FormatEnv(LetterEnv):
        """Every action earns a local format reward of 0.1; no task is ever solved."""

        def step(self, state, *, agent, role, action):
            result = super().step(state, agent=agent, role=role, action=action)
            return type(result)(state=type(result.state)(**{**result.state.__dict__, "success": False}), local_reward=0.1,
                                team_reward=0.0)

    config = make_config("lora")
    env = FormatEnv()
    sampler = Sampler(env, build_policies(config, device=torch.device("cpu")), config, torch.Generator().manual_seed(0))
    try:
        (result,) = evaluation.evaluate(sampler, [(f"eval-{i}", r) for i, r in enumerate(env.generate(2, seed=1))], step=0)
    finally:
        sampler.pool.shutdown()
    assert result["team"]["success"] == 0.0
    assert {name: a["success"] for name, a in result["agents"].items()} == {"writer": 0.0, "echo": 0.0}
    assert result["agents"]["writer"]["reward"] == pytest.approx(0.1)


def test_async_rollouts_without_importance_sampling_are_warned_about(make_config):
    from training.config import config_warnings

    config = make_config("lora", **{"generation.async": "one_step_off", "grpo.importance_sampling": False})
    (warning,) = [w for w in config_warnings(config) if "generation.async" in w]
    assert "no correction" in warning
    assert not [w for w in config_warnings(config.replace(**{"grpo.importance_sampling": True})) if "generation.async" in w]
