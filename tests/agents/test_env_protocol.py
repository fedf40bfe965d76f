"""Properties every built-in environment has: the protocol, seeded generators, pure steps."""

from __future__ import annotations

import copy

import pytest

from agents.base import Environment, State
from agents.envs import BUILTIN, list_environments, load_environment

NAMES = sorted(BUILTIN)
JUNK = ["", "I don't know.", "```python\nraise SystemExit(3)\n```", "Answer: banana\nMoves: X Y", "x" * 5000]


@pytest.mark.parametrize("name", NAMES)
def test_it_implements_the_protocol(name: str) -> None:
    env = load_environment(name)
    assert isinstance(env, Environment)
    assert env.name == name
    instructions = BUILTIN[name].default_instructions
    assert set(instructions) == set(env.roles) and all(len(t) > 40 for t in instructions.values())


@pytest.mark.parametrize("name", NAMES)
def test_it_generates_the_same_rows_for_a_seed(name: str) -> None:
    env = load_environment(name)
    rows = env.generate(6, seed=11)
    assert rows == env.generate(6, seed=11)
    assert rows != env.generate(6, seed=12)
    assert len(rows) == 6
    for row in rows:
        assert all(row.get(f) not in (None, "", []) for f in env.required_fields)


@pytest.mark.parametrize("name", NAMES)
def test_it_generates_varied_tasks(name: str) -> None:
    env = load_environment(name)
    rows = env.generate(40, seed=3)
    if name == "referential":  # a small task space by design (4 targets x 24 orders): every target at every letter
        assert {r["target"] for r in rows} == set(env.generate(1, seed=0)[0]["candidates"])
        assert {r["candidates"].index(r["target"]) for r in rows} == set(range(env.k))
        return
    key = "grid" if name == "plan_path" else ("prompt" if name == "code_tests" else "question")
    assert len({r[key] for r in rows}) >= 36


@pytest.mark.parametrize("name", NAMES)
def test_it_never_mutates_the_state_it_steps_from(name: str) -> None:
    env = load_environment(name)
    row = env.generate(1, seed=5)[0]
    state = env.reset(row, task_id="t", roles=env.roles)
    for role in env.roles:
        before = copy.deepcopy(state)
        first = env.step(state, agent="a", role=role, action=JUNK[2])
        second = env.step(state, agent="a", role=role, action=JUNK[1])
        assert state == before
        assert first.state is not state and second.state is not state
        assert first.state.turn == second.state.turn == state.turn + 1
        assert first.state.dialogue[-1].text == JUNK[2] and second.state.dialogue[-1].text == JUNK[1]
        again = env.step(state, agent="a", role=role, action=JUNK[2])
        assert (again.local_reward, again.team_reward, again.state) == (first.local_reward, first.team_reward, first.state)


@pytest.mark.parametrize("name", NAMES)
def test_it_scores_junk_without_crashing(name: str) -> None:
    env = load_environment(name)
    state = env.reset(env.generate(1, seed=2)[0], task_id="t", roles=env.roles)
    for role in env.roles:
        obs = env.observe(state, role)
        assert isinstance(obs, str) and obs
        for action in JUNK:
            result = env.step(state, agent="a", role=role, action=action)
            assert isinstance(result.local_reward, float) and isinstance(result.team_reward, float)
            assert -1.0 <= result.local_reward <= 1.0 and result.team_reward in (0.0, 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_it_refuses_unknown_roles_and_finished_episodes(name: str) -> None:
    env = load_environment(name)
    state = env.reset(env.generate(1, seed=2)[0], task_id="t", roles=env.roles)
    with pytest.raises(ValueError, match="no role"):
        env.step(state, agent="a", role="nobody", action="x")
    with pytest.raises(ValueError, match="roles are"):
        env.reset(env.generate(1, seed=2)[0], task_id="t", roles=("nobody",))
    done = State(task_id="t", row=state.row, done=True, data=state.data)
    with pytest.raises(ValueError, match="over"):
        env.step(done, agent="a", role=env.roles[0], action="x")


def test_it_lists_the_builtins() -> None:
    infos = {i.name: i for i in list_environments()}
    assert set(infos) == set(BUILTIN)
    assert infos["math_tool"].roles == ("tool", "reasoner") and "level" in infos["math_tool"].args


@pytest.mark.parametrize("name", NAMES)
def test_it_ends_actions_once_they_are_complete(name: str) -> None:
    import re

    patterns = BUILTIN[name].stop_patterns
    assert set(patterns) == set(BUILTIN[name].roles)
    complete = {
        "solver": "12 + 30 = 42\nAnswer: 42\n",
        "reasoner": "The program is right.\nAnswer: 42\n",
        "tool": "Here:\n```python\nprint(42)\n```",
        "coder": "```python\ndef f():\n    return 1\n```",
        "tester": "```python\nassert f() == 1\n```",
        "plan": "Go around the wall.\nMoves: R R D D\n",
        "speaker": "3\n",
        "listener": "B\n",
    }
    for role, pattern in patterns.items():
        rx = re.compile(pattern, re.DOTALL)
        text = complete[role]
        assert rx.search(text), role
        assert not rx.search(text[: text.rfind("\n" if text.endswith("\n") else "`")]), role  # not before the end
