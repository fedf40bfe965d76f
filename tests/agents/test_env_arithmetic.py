"""The `arithmetic` environment: one solver, reward 1 for the right answer."""

from __future__ import annotations

import pytest

from agents.envs import load_environment


def test_it_rewards_the_right_answer_and_ends() -> None:
    env = load_environment("arithmetic")
    state = env.reset({"question": "What is 2 + 3?", "answer": "5"}, task_id="t", roles=("solver",))
    assert "What is 2 + 3?" in env.observe(state, "solver")
    r = env.step(state, agent="solo", role="solver", action="2 + 3 = 5\nAnswer: 5")
    assert (r.local_reward, r.team_reward) == (1.0, 1.0)
    assert r.state.done and r.state.success


@pytest.mark.parametrize("action", ["Answer: 6", "no idea", ""])
def test_it_gives_zero_for_wrong_or_malformed_answers(action: str) -> None:
    env = load_environment("arithmetic")
    state = env.reset({"question": "What is 2 + 3?", "answer": 5}, task_id="t", roles=("solver",))
    r = env.step(state, agent="solo", role="solver", action=action)
    assert (r.local_reward, r.team_reward) == (0.0, 0.0)
    assert r.state.done and not r.state.success


@pytest.mark.parametrize("level", [1, 2, 3])
def test_it_generates_correct_answers(level: int) -> None:
    env = load_environment("arithmetic", level=level)
    for row in env.generate(30, seed=level):
        expr = row["question"].removeprefix("What is ").rstrip("?")
        assert str(eval(expr)) == row["answer"]  # noqa: S307 - generated arithmetic


def test_it_rejects_a_bad_level() -> None:
    with pytest.raises(ValueError, match="level"):
        load_environment("arithmetic", level=9)
