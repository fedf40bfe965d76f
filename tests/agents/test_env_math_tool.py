"""The `math_tool` environment: a tool agent's program and a reasoner's answer."""

from __future__ import annotations

import re

import pytest

from agents.base import State
from agents.envs import load_environment
from agents.envs.math_tool import MathTool

ROW = {"question": "Compute (12 + 7) * 3.", "answer": "57"}


def code(body: str) -> str:
    return f"Here is the program:\n```python\n{body}\n```"


@pytest.fixture
def env() -> MathTool:
    return MathTool(level=2, timeout_s=1.0)


@pytest.fixture
def start(env: MathTool) -> State:
    return env.reset(ROW, task_id="t", roles=("tool", "reasoner"))


def test_it_rewards_a_right_program_and_waits_for_the_reasoner(env: MathTool, start: State) -> None:
    r = env.step(start, agent="coder", role="tool", action=code("print((12 + 7) * 3)"))
    assert r.local_reward == 1.0
    assert r.team_reward == 0.0 and not r.state.done  # the reasoner has not answered
    assert r.tool_output == "57"
    obs = env.observe(r.state, "reasoner")
    assert "Compute (12 + 7) * 3." in obs and "print((12 + 7) * 3)" in obs and "57" in obs


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        (code("print(12 + 7 * 3)"), 0.0),  # runs, wrong number
        (code("print('hello')"), 0.0),  # runs, no number
        (code("print(1 / 0)"), -1.0),  # error
        (code("while True:\n    pass"), -1.0),  # timeout
        ("The answer is (12 + 7) * 3 = 57", -1.0),  # no code block
    ],
)
def test_it_scores_wrong_and_broken_programs(env: MathTool, start: State, action: str, reward: float) -> None:
    r = env.step(start, agent="coder", role="tool", action=action)
    assert r.local_reward == reward and r.team_reward == 0.0 and not r.state.done


def test_it_ends_when_the_reasoner_agrees_with_the_tool(env: MathTool, start: State) -> None:
    s1 = env.step(start, agent="coder", role="tool", action=code("print((12 + 7) * 3)")).state
    r = env.step(s1, agent="thinker", role="reasoner", action="The program is right.\nAnswer: 57")
    assert (r.local_reward, r.team_reward) == (1.0, 1.0)
    assert r.state.done and r.state.success


@pytest.mark.parametrize(("action", "reward"), [("Answer: 40", 0.0), ("I am not sure.", -0.5)])
def test_it_scores_wrong_and_missing_answers(env: MathTool, start: State, action: str, reward: float) -> None:
    s1 = env.step(start, agent="coder", role="tool", action=code("print((12 + 7) * 3)")).state
    r = env.step(s1, agent="thinker", role="reasoner", action=action)
    assert r.local_reward == reward and r.team_reward == 0.0
    assert not r.state.done and not r.state.success  # no agreement yet: another round


def test_it_rewards_the_team_for_the_reasoners_answer_even_against_the_tool(env: MathTool, start: State) -> None:
    s1 = env.step(start, agent="coder", role="tool", action=code("print(12 + 7 * 3)")).state
    r = env.step(s1, agent="thinker", role="reasoner", action="The tool forgot the brackets. Answer: 57")
    assert (r.local_reward, r.team_reward) == (1.0, 1.0)
    assert not r.state.done and r.state.success
    s3 = env.step(r.state, agent="coder", role="tool", action=code("print((12 + 7) * 3)"))
    assert s3.state.done and s3.team_reward == 1.0  # the fixed tool output now agrees


def test_it_ends_after_one_action_for_a_tool_only_team(env: MathTool) -> None:
    state = env.reset(ROW, task_id="t", roles=("tool",))
    r = env.step(state, agent="coder", role="tool", action=code("print(57)"))
    assert (r.local_reward, r.team_reward) == (1.0, 1.0) and r.state.done and r.state.success
    r = env.step(state, agent="coder", role="tool", action=code("print(56)"))
    assert (r.local_reward, r.team_reward) == (0.0, 0.0) and r.state.done and not r.state.success


def test_it_accepts_csv_style_rows(env: MathTool) -> None:
    state = env.reset({"question": "Compute 1,000 + 1.", "answer": "1,001"}, task_id="t", roles=("tool",))
    assert env.step(state, agent="c", role="tool", action=code("print(1001)")).local_reward == 1.0


def test_it_generates_each_level() -> None:
    one = load_environment("math_tool", level=1).generate(30, seed=0)
    assert all(re.fullmatch(r"Compute \d\d \+ \d\d\.", r["question"]) for r in one)
    two = load_environment("math_tool", level=2).generate(30, seed=0)
    for row in two:
        expr = row["question"].removeprefix("Compute ").removesuffix(".")
        assert len(re.findall(r"[-+*]", expr)) == 2
        assert str(eval(expr)) == row["answer"]  # noqa: S307 - generated arithmetic
    three = load_environment("math_tool", level=3).generate(30, seed=0)
    assert all(r["question"].endswith("?") and int(r["answer"]) >= 0 for r in three)
    assert len({r["question"].split(".")[0].split(" ", 1)[1][:8] for r in three}) > 4  # several templates


def test_it_rejects_a_bad_level() -> None:
    with pytest.raises(ValueError, match="level must be 1, 2 or 3"):
        load_environment("math_tool", level=0)


def test_a_list_of_levels_mixes_them_and_each_row_names_its_level() -> None:
    rows = load_environment("math_tool", level=[2, 3]).generate(200, seed=0)
    levels = [r["level"] for r in rows]
    assert set(levels) == {2, 3} and 70 < levels.count(2) < 130
    for row in rows:  # each row is a task of the level it names
        assert row["question"].startswith("Compute ") == (row["level"] == 2)
    assert load_environment("math_tool", level=[2, 3]).generate(20, seed=5) == load_environment("math_tool", level=[2, 3]).generate(20, seed=5)
    assert load_environment("math_tool", level=[2]).generate(10, seed=1) == load_environment("math_tool", level=2).generate(10, seed=1)


@pytest.mark.parametrize("bad", [[], [2, 4], [True], "2"])
def test_it_rejects_a_bad_level_list(bad: object) -> None:
    with pytest.raises(ValueError, match="non-empty list"):
        load_environment("math_tool", level=bad)
