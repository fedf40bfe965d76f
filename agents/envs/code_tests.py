"""`code_tests`: a coder writes a function; a tester writes assert-based tests for it.

Rewards (local, for the agent that acted):
- coder: the fraction of the row's hidden tests its code passes.
- tester: 0 when its tests fail on the reference solution (or there are none); otherwise the
  fraction of the row's mutants (wrong solutions) its tests catch.
Team reward: 1.0 when the coder's latest code passes every hidden test (with no coder in the
team: when the tester's tests pass the reference and catch every mutant).
The episode ends once every role in the team has acted and the coder's code passes the hidden
tests or the tester's tests; with a single role, after its first action. `success` = team reward 1.

Hidden tests, the reference and the mutants never appear in an observation. Each agent sees
what running the other's work produced: the coder sees the tester's tests and how its code
fared on them; the tester sees the coder's code and how its tests fared on it.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agents.base import Message, RowField, State, StepResult, required_of
from agents.envs._common import (
    STOP_AFTER_CODE_BLOCK,
    TOOL_TIMEOUT_S,
    advance,
    check_roles,
    check_turn,
    clip,
    describe_run,
    run_cached,
    tests_cached,
    tool_timeout,
)
from agents.envs.code_tasks import TEMPLATES, make_task
from agents.parsing import extract_code


def _mutants(row: dict[str, Any]) -> list[str]:
    value = row.get("mutants") or []
    if isinstance(value, str):  # CSV cells hold the list as JSON
        try:
            value = json.loads(value)
        except ValueError:
            value = [value]
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise ValueError("code_tests: `mutants` must be a list of code strings (or a JSON list in a CSV cell)")
    return value


class CodeTests:
    """A coder writes a function, a tester writes tests that tell right code from wrong code."""

    name = "code_tests"
    roles: tuple[str, ...] = ("coder", "tester")
    solo_roles: tuple[str, ...] = ("coder", "tester")
    """Either role can play alone: the coder is judged by the hidden tests, the tester by the mutants its tests kill."""
    row_fields: dict[str, RowField] = {
        "prompt": RowField("text", help="the task both agents see"),
        "reference": RowField("text", help="a correct solution (Python source)"),
        "hidden_tests": RowField("text", help="assert lines the coder's code must pass (never shown)"),
        "mutants": RowField("text_list", help="wrong solutions the tester's tests should catch (in CSV: a JSON list)"),
        "entry_point": RowField("text", required=False, help="the function's name (kept as metadata)"),
        "template": RowField("text", required=False, help="the generator's template (kept as metadata)"),
    }
    """What a dataset row holds (checked on upload; see `agents.base.RowField`)."""
    required_fields: tuple[str, ...] = required_of(row_fields)
    default_instructions: dict[str, str] = {
        "coder": (
            "You are a Python programmer. Write the requested function. If tests are shown, make "
            "your function pass them when they are right. Reply with one ```python code block."
        ),
        "tester": (
            "You write unit tests. Write assert statements that call the requested function on "
            "several inputs, including edge cases, and check the exact results. Do not write the "
            "function itself. Reply with one ```python code block of assert lines."
        ),
    }

    stop_patterns: dict[str, str] = {"coder": STOP_AFTER_CODE_BLOCK, "tester": STOP_AFTER_CODE_BLOCK}
    """End the action once its code block is closed (see `agents.envs`)."""

    def __init__(self, timeout_s: float = TOOL_TIMEOUT_S) -> None:
        """`timeout_s` limits each sandboxed run of code plus tests."""
        self.timeout_s = tool_timeout("code_tests", timeout_s)

    def generate(self, n: int, *, seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        order = list(TEMPLATES)
        rows = []
        for i in range(n):
            if i % len(order) == 0:
                rng.shuffle(order)  # every template once per round, in a seeded order
            rows.append(make_task(order[i % len(order)], rng))
        return rows

    def reset(self, row: dict[str, Any], *, task_id: str, roles: tuple[str, ...]) -> State:
        roles = check_roles(self.name, self.roles, roles)
        data = {"roles": roles, "mutants": tuple(_mutants(row)), "code": None, "tests": None, "hidden_pass": False, "agree": False}
        return State(task_id=task_id, row=dict(row), data=data)

    def observe(self, state: State, role: str) -> str:
        parts = [f"Task: {state.row['prompt']}"]
        code, tests = state.data.get("code"), state.data.get("tests")
        if role == "coder":
            if code is not None:
                parts.append(f"Your previous code:\n```python\n{clip(code, 1200, keep='head')}\n```")
            if tests is not None:
                parts.append(f"The tester's tests:\n```python\n{clip(tests, 1000, keep='head')}\n```")
                if state.data.get("code_vs_tests"):
                    parts.append(f"Your code on these tests: {state.data['code_vs_tests']}")
            elif state.data.get("coder_output"):
                parts.append(f"Running your code: {state.data['coder_output']}")
            parts.append("Write the function in a ```python code block.")
        else:
            if code is not None:
                parts.append(f"The coder's code:\n```python\n{clip(code, 1200, keep='head')}\n```")
            if tests is not None:
                parts.append(f"Your previous tests:\n```python\n{clip(tests, 1000, keep='head')}\n```")
                if state.data.get("code_vs_tests"):
                    parts.append(f"The coder's code on them: {state.data['code_vs_tests']}")
            parts.append("Write assert tests for the function in a ```python code block.")
        return "\n\n".join(parts)

    def _tester_reward(self, state: State, tests: str | None) -> tuple[float, dict[str, Any]]:
        if tests is None:
            return 0.0, {"reference_passes": False, "killed": 0}
        on_reference = tests_cached(state.row["reference"], tests, self.timeout_s)
        if not on_reference.all_passed:
            return 0.0, {"reference_passes": False, "killed": 0}
        mutants: tuple[str, ...] = state.data["mutants"]
        killed = sum(1 for m in mutants if not tests_cached(m, tests, self.timeout_s).all_passed)
        return (killed / len(mutants) if mutants else 1.0), {"reference_passes": True, "killed": killed}

    def step(self, state: State, *, agent: str, role: str, action: str) -> StepResult:
        check_turn(self.name, self.roles, state, role)
        roles: tuple[str, ...] = state.data["roles"]
        block = extract_code(action)
        updates: dict[str, Any] = {}
        info: dict[str, Any] = {}
        tool_output: str | None = None
        code = state.data["code"]
        tests = state.data["tests"]
        if role == "coder":
            code = block if block is not None else action
            hidden = tests_cached(code, state.row["hidden_tests"], self.timeout_s)
            local = hidden.fraction
            updates.update(code=code, hidden_pass=hidden.all_passed)
            info.update(hidden_passed=hidden.passed, hidden_total=hidden.total)
            if tests is None:  # nothing to test against yet: show what running the code does
                tool_output = describe_run(run_cached(code, self.timeout_s), max_chars=300)
                updates["coder_output"] = tool_output
        else:
            tests = block
            local, parts = self._tester_reward(state, tests)
            info.update(parts)
            updates["tests"] = tests
            tool_output = None if tests is not None else "error: no ```python block of tests"
        if code is not None and tests is not None:
            vs = tests_cached(code, tests, self.timeout_s)
            updates.update(code_vs_tests=vs.summary(), agree=vs.all_passed)
            tool_output = vs.summary()
        data = {**state.data, **updates}
        if "coder" in roles:
            team_ok = bool(data["hidden_pass"])
        else:
            team_ok = self._tester_reward(state, data["tests"])[0] == 1.0
        acted = {m.role for m in state.dialogue} | {role}
        done = len(roles) == 1 or (acted >= set(roles) and (team_ok or bool(data["agree"])))
        next_state = advance(state, Message(agent, role, action, tool_output), done=done, success=team_ok, **updates)
        return StepResult(next_state, local_reward=local, team_reward=1.0 if team_ok else 0.0, tool_output=tool_output, info=info)
