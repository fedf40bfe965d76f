"""`self_correct`: a lone agent of math_tool or plan_path may retry until it repeats its answer."""

from __future__ import annotations

import pytest

from agents.envs import load_environment
from agents.envs.math_tool import MathTool
from agents.envs.plan_path import PlanPath

ROW = {"question": "Compute (12 + 7) * 3.", "answer": "57"}
GRID = "S.#\n..#\n#.G"


def program(body: str) -> str:
    return f"```python\n{body}\n```"


def test_it_lets_a_lone_tool_retry_until_two_programs_agree() -> None:
    env = MathTool(level=2, timeout_s=2.0, self_correct=True)
    s0 = env.reset(ROW, task_id="t", roles=("tool",))
    r1 = env.step(s0, agent="tool", role="tool", action=program("print(12 + 7 * 3)"))
    assert not r1.state.done and r1.team_reward == 0.0
    obs = env.observe(r1.state, "tool")
    assert "print(12 + 7 * 3)" in obs and "It printed: 33" in obs and "corrected" in obs
    r2 = env.step(r1.state, agent="tool", role="tool", action=program("print((12 + 7) * 3)"))
    assert not r2.state.done and r2.state.success  # a new answer: it may still change its mind
    r3 = env.step(r2.state, agent="tool", role="tool", action=program("x = 19\nprint(x * 3)"))
    assert r3.state.done and r3.state.success and r3.team_reward == 1.0


def test_a_lone_tool_that_keeps_failing_is_not_stopped_by_agreeing_errors() -> None:
    env = MathTool(level=2, timeout_s=2.0, self_correct=True)
    s0 = env.reset(ROW, task_id="t", roles=("tool",))
    r1 = env.step(s0, agent="tool", role="tool", action="no code")
    r2 = env.step(r1.state, agent="tool", role="tool", action="still no code")
    assert not r2.state.done and r2.local_reward == -1.0  # max_turns ends it, not two missing answers


def test_it_shows_a_lone_reasoner_its_last_answer_and_stops_when_it_repeats() -> None:
    env = MathTool(level=2, self_correct=True)
    s0 = env.reset(ROW, task_id="t", roles=("reasoner",))
    r1 = env.step(s0, agent="r", role="reasoner", action="Answer: 56")
    assert not r1.state.done and "Your previous answer: 56" in env.observe(r1.state, "reasoner")
    r2 = env.step(r1.state, agent="r", role="reasoner", action="Answer: 56")
    assert r2.state.done and not r2.state.success


def test_without_it_a_lone_agent_acts_once_and_a_team_is_unchanged() -> None:
    env = MathTool(level=2, timeout_s=2.0)
    s0 = env.reset(ROW, task_id="t", roles=("tool",))
    assert env.step(s0, agent="tool", role="tool", action=program("print(1)")).state.done
    team = MathTool(level=2, timeout_s=2.0, self_correct=True)
    t0 = team.reset(ROW, task_id="t", roles=("tool", "reasoner"))
    t1 = team.step(t0, agent="tool", role="tool", action=program("print(57)")).state
    assert "Your previous answer" not in team.observe(t1, "reasoner")
    assert team.step(t1, agent="r", role="reasoner", action="Answer: 57").state.done


def test_a_lone_planner_retries_until_it_repeats_its_moves_or_reaches_the_goal() -> None:
    env = PlanPath(self_correct=True)
    s0 = env.reset({"grid": GRID}, task_id="t", roles=("plan",))
    r1 = env.step(s0, agent="p", role="plan", action="Moves: R R")
    assert not r1.state.done and "Your previous moves: R R" in env.observe(r1.state, "plan")
    r2 = env.step(r1.state, agent="p", role="plan", action="Moves: D D")
    assert not r2.state.done
    assert env.step(r2.state, agent="p", role="plan", action="Moves: D D").state.done
    reached = env.step(r1.state, agent="p", role="plan", action="Moves: D R D R")
    assert reached.state.done and reached.state.success


def test_a_lone_plan_path_tool_retries_with_its_last_output() -> None:
    env = PlanPath(timeout_s=2.0, self_correct=True)
    s0 = env.reset({"grid": GRID}, task_id="t", roles=("tool",))
    r1 = env.step(s0, agent="t", role="tool", action=program("print('R R')"))
    assert not r1.state.done and "Your previous program printed: R R" in env.observe(r1.state, "tool")
    assert env.step(r1.state, agent="t", role="tool", action=program("print('R' + ' R')")).state.done


@pytest.mark.parametrize("name", ["math_tool", "plan_path"])
def test_it_is_an_env_arg_and_refuses_a_non_boolean(name: str) -> None:
    assert load_environment(name, self_correct=True).self_correct is True  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="self_correct must be true or false"):
        load_environment(name, self_correct="yes")
