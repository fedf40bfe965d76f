"""The `code_tests` environment: coder and tester rewards, generated tasks."""

from __future__ import annotations

import json

import pytest

from agents.base import State
from agents.envs.code_tasks import TEMPLATES
from agents.envs.code_tests import CodeTests

ROW = {
    "prompt": "Write a Python function `add(a: int, b: int) -> int` that returns a + b.",
    "reference": "def add(a, b):\n    return a + b\n",
    "hidden_tests": "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(0, 0) == 0\nassert add(2, 2) == 4\n",
    "mutants": ["def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a * b\n", "def add(a, b):\n    return abs(a) + b\n"],
}


def block(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture
def env() -> CodeTests:
    return CodeTests(timeout_s=2.0)


@pytest.fixture
def start(env: CodeTests) -> State:
    return env.reset(ROW, task_id="t", roles=("coder", "tester"))


def test_it_generates_a_dozen_templates_with_killable_mutants() -> None:
    assert len(TEMPLATES) >= 12
    for seed in range(3):
        for row in CodeTests().generate(len(TEMPLATES), seed=seed):
            namespace: dict = {}
            exec(row["reference"] + row["hidden_tests"], namespace)  # noqa: S102 - our own template code
            assert 2 <= len(row["mutants"]) <= 4
            for mutant in row["mutants"]:
                with pytest.raises(Exception):  # noqa: B017, PT011 - any failure kills the mutant
                    exec(mutant + row["hidden_tests"], {})  # noqa: S102 - our own template code
            assert row["entry_point"] in row["prompt"] and "Example:" in row["prompt"]
    assert {r["template"] for r in CodeTests().generate(len(TEMPLATES), seed=0)} == {t.name for t in TEMPLATES}


def test_it_rewards_a_correct_coder(env: CodeTests, start: State) -> None:
    r = env.step(start, agent="c", role="coder", action=block(ROW["reference"]))
    assert (r.local_reward, r.team_reward) == (1.0, 1.0)
    assert r.state.success and not r.state.done  # the tester has not acted yet
    assert "add(1, 2) == 3" not in env.observe(r.state, "tester")  # hidden tests stay hidden


@pytest.mark.parametrize(
    ("action", "reward"),
    [
        (block("def add(a, b):\n    return a + b + (1 if a < 0 else 0)"), 0.75),
        (block("def add(a, b):\n    return a * b"), 0.5),
        ("I would add the numbers.", 0.0),
        (block("def add(a, b) return"), 0.0),
    ],
)
def test_it_gives_the_coder_the_fraction_of_hidden_tests(env: CodeTests, start: State, action: str, reward: float) -> None:
    r = env.step(start, agent="c", role="coder", action=action)
    assert r.local_reward == pytest.approx(reward)
    assert r.team_reward == (1.0 if reward == 1.0 else 0.0)


@pytest.mark.parametrize(
    ("tests", "reward"),
    [
        ("assert add(2, 3) == 5\nassert add(-2, 3) == 1", 1.0),  # kills all three mutants
        ("assert add(2, 2) == 4", 1 / 3),  # only a - b dies (2 * 2 == 4 and abs(2) + 2 == 4)
        ("assert add(2, 2) == 5", 0.0),  # fails on the reference
        ("assert True", 0.0),  # passes everything, kills nothing
    ],
)
def test_it_rewards_tests_that_tell_right_from_wrong(env: CodeTests, start: State, tests: str, reward: float) -> None:
    r = env.step(start, agent="t", role="tester", action=block(tests))
    assert r.local_reward == pytest.approx(reward)


def test_it_gives_zero_for_no_tests(env: CodeTests, start: State) -> None:
    r = env.step(start, agent="t", role="tester", action="You should test negative numbers.")
    assert r.local_reward == 0.0 and r.tool_output is not None and "no" in r.tool_output


def test_it_shows_each_agent_the_others_results(env: CodeTests, start: State) -> None:
    s1 = env.step(start, agent="c", role="coder", action=block("def add(a, b):\n    return a * b")).state
    r = env.step(s1, agent="t", role="tester", action=block("assert add(2, 3) == 5"))
    assert r.tool_output is not None and "0/1 tests passed" in r.tool_output
    obs = env.observe(r.state, "coder")
    assert "assert add(2, 3) == 5" in obs and "0/1 tests passed" in obs and "return a * b" in obs
    assert not r.state.done
    fixed = env.step(r.state, agent="c", role="coder", action=block(ROW["reference"]))
    assert fixed.state.done and fixed.state.success and fixed.team_reward == 1.0


def test_it_ends_after_one_action_for_a_single_role(env: CodeTests) -> None:
    state = env.reset(ROW, task_id="t", roles=("coder",))
    r = env.step(state, agent="c", role="coder", action=block(ROW["reference"]))
    assert r.state.done and r.state.success


def test_it_accepts_mutants_as_a_json_cell(env: CodeTests) -> None:
    state = env.reset({**ROW, "mutants": json.dumps(ROW["mutants"])}, task_id="t", roles=("tester",))
    r = env.step(state, agent="t", role="tester", action=block("assert add(2, 3) == 5\nassert add(-2, 3) == 1"))
    assert r.local_reward == 1.0 and r.team_reward == 1.0 and r.state.done
